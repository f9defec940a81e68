package executor

import "github.com/tandem-inference/tandem/prefill-worker/planner"

// SetOnCall sets a hook called after each call of a layer cut into
// several (tests).
func SetOnCall(e *Executor, f func(layer int, rows planner.Range)) { e.onCall = f }
