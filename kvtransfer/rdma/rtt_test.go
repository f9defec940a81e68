package rdma

import (
	"testing"
	"time"
)

// TestRTTEstimator: steady round trips keep the floor; varying ones raise
// the timeout above their spread; it never passes the ceiling.
func TestRTTEstimator(t *testing.T) {
	const floor, ceil = 10 * time.Millisecond, 500 * time.Millisecond
	var e rttEstimator
	if got := e.rto(floor, ceil); got != floor {
		t.Fatalf("no sample: %v, want the floor", got)
	}
	for i := 0; i < 50; i++ {
		e.sample(100 * time.Microsecond)
	}
	if got := e.rto(floor, ceil); got != floor {
		t.Fatalf("steady 100us round trips: %v, want the floor %v", got, floor)
	}
	// Round trips alternating 1 ms and 15 ms (a loaded machine): the
	// timeout must exceed the longest, or every slow ack is a false loss.
	for i := 0; i < 50; i++ {
		e.sample(time.Millisecond)
		e.sample(15 * time.Millisecond)
	}
	if got := e.rto(floor, ceil); got <= 15*time.Millisecond || got >= 60*time.Millisecond {
		t.Fatalf("round trips of 1..15 ms: timeout %v, want above 15 ms and within a few spreads", got)
	}
	for i := 0; i < 10; i++ {
		e.sample(2 * time.Second)
	}
	if got := e.rto(floor, ceil); got != ceil {
		t.Fatalf("2 s round trips: %v, want the ceiling %v", got, ceil)
	}
}
