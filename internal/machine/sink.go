package machine

import "sync/atomic"

// atomicUint64 keeps loop results observable so that no loop is optimised
// away, without a data race between the timing goroutines.
type atomicUint64 struct{ atomic.Uint64 }
