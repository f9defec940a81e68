package testctx

import (
	"testing"
	"time"
)

// The context ends before the binary's deadline, and with the test.
func TestContextEndsBeforeTheBinarysDeadline(t *testing.T) {
	var ctx interface{ Done() <-chan struct{} }
	t.Run("inner", func(t *testing.T) {
		c := Context(t)
		got, ok := c.Deadline()
		if !ok {
			t.Fatal("no deadline")
		}
		if d, ok := t.Deadline(); ok && !got.Before(d) {
			t.Fatalf("context deadline %v is not before the binary's %v", got, d)
		}
		if time.Until(got) <= 0 {
			t.Fatalf("deadline %v already passed", got)
		}
		ctx = c
	})
	select {
	case <-ctx.Done():
	default:
		t.Fatal("the context outlived its test")
	}
}
