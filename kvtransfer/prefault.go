package kvtransfer

import "os"

var pageSize = os.Getpagesize()

// prefault writes one byte in every page of b, so that the operating system
// maps and zeroes the pages now rather than while chunks arrive: first-touch
// faults took about 40% of a receiver's CPU time on loopback. The receiver
// calls it when a sender first authenticates, which is when prefill starts,
// so the cost overlaps the prefill of the first layers.
func prefault(b []byte) {
	for i := 0; i < len(b); i += pageSize {
		b[i] = 0
	}
}
