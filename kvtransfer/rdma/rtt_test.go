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

// TestProbeAnswer: only the answer to the pending probe settles it, and
// it asks for a resend only when the ack did not move and falls short of
// what was sent before the probe; an answer to an older probe (it came
// after the timer had sent the next one) is ignored, so slots that were
// only late are not resent.
func TestProbeAnswer(t *testing.T) {
	reply := func(ack uint64, num uint16) slotHeader {
		return slotHeader{kind: kindCtl, flags: flagProbeReply, ack: ack, probe: num}
	}
	for _, tc := range []struct {
		name            string
		h               slotHeader
		acked, probeSeq uint64
		num             uint16
		settled, resend bool
	}{
		{"lost after the ack", reply(10, 3), 10, 15, 3, true, true},
		{"everything arrived", reply(14, 3), 14, 15, 3, true, false},
		{"the ack moved on the way", reply(12, 3), 13, 15, 3, true, false},
		{"an older probe's answer", reply(10, 2), 10, 15, 3, false, false},
		{"no probe pending", reply(10, 3), 10, 0, 3, false, false},
		{"not an answer", slotHeader{kind: kindCtl, ack: 10, probe: 3}, 10, 15, 3, false, false},
	} {
		settled, resend := probeAnswer(tc.h, tc.acked, tc.probeSeq, tc.num)
		if settled != tc.settled || resend != tc.resend {
			t.Errorf("%s: settled %v resend %v, want %v %v", tc.name, settled, resend, tc.settled, tc.resend)
		}
	}
}
