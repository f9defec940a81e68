// Package testctx bounds a test's waits by the test binary's own deadline.
//
// A fixed per-test timeout ("30 s is plenty") is a guess about the
// machine's speed: under qemu on a loaded 2-core machine it fails tests
// that are merely slow. The deadline that go test -timeout sets is the one
// the person running the suite chose; a test that hangs still fails, with
// time left to report which wait it was.
package testctx

import (
	"context"
	"testing"
	"time"
)

// fallback bounds a test when the binary runs without -timeout (-timeout 0).
const fallback = 10 * time.Minute

// Context is canceled when the test ends or shortly before the binary's
// deadline, whichever comes first. The margin before the deadline (a
// tenth of the time left, at most a minute) lets the failing wait report
// itself instead of the binary's panic.
func Context(t *testing.T) context.Context {
	t.Helper()
	d, ok := t.Deadline()
	if !ok {
		d = time.Now().Add(fallback)
	}
	d = d.Add(-min(time.Minute, time.Until(d)/10))
	ctx, cancel := context.WithDeadline(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
