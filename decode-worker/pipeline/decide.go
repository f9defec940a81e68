package pipeline

import (
	"time"

	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/model"
)

// The head's scheduling and the ranks' control decisions, as pure
// functions of what the loop knows: the loop (schedule.go, control.go,
// head.go) does the I/O and the bookkeeping around them, and
// decide_test.go checks each rule without a ring, a model or a clock.

// pickSlot is the decode slot a ready sequence joins: the smallest of the
// slots with room (fewer than maxBatch members; the first on a tie), or -1
// when every slot is full and the sequence waits.
func pickSlot(sizes []int, maxBatch int) int {
	best := -1
	for k, n := range sizes {
		if n < maxBatch && (best < 0 || n < sizes[best]) {
			best = k
		}
	}
	return best
}

// prefillRows plans one prefill step over the queued sequences, in queue
// order: pending[i] prompt tokens are left of sequence i, whose state
// already holds pos[i]. With budget 0 every queued prompt goes whole;
// otherwise the step takes at most budget rows, and a sequence cut short
// ends its share on a multiple of the KDA chunk counted from its start, so
// that chunked prefill is bit-identical to prefilling it at once. A
// sequence whose stops[i] (its next prefix-cache snapshot, itself on the
// grid; 0: none; stops may be nil) lies inside its share ends the share
// there, so that its state can be kept at that position. It returns the
// rows of each sequence taken (len(rows) <= len(pending)).
func prefillRows(pending, pos, stops []int, budget int) []int {
	var rows []int
	for i, n := range pending {
		if stops != nil && stops[i] > pos[i] {
			n = min(n, stops[i]-pos[i])
		}
		if budget > 0 && n > budget {
			n = (pos[i]+budget)/model.KDAChunk*model.KDAChunk - pos[i]
		}
		if n <= 0 {
			break
		}
		rows = append(rows, n)
		if budget > 0 {
			if budget -= n; budget <= 0 {
				break
			}
		}
	}
	return rows
}

// prefillDue reports whether the head launches a prefill step: prompts are
// queued and fewer than maxSteps prefill steps are in flight.
func prefillDue(queued, inFlight, maxSteps int) bool {
	return queued > 0 && inFlight < maxSteps
}

// resetLinks are the links a rank sends its Reset on when its link in
// direction lost died: away from the failure (the other link), and on both
// when the cause is not a link (a stalled step, lost == 0).
func resetLinks(lost mesh.Dir) (up, down bool) {
	return lost != mesh.Upstream, lost != mesh.Downstream
}

// passReset is where a Reset that came from direction from goes on: the
// way it travels, so that the waves from both ends of a lost link reach
// every rank once.
func passReset(from mesh.Dir) (up, down bool) {
	return from == mesh.Downstream, from == mesh.Upstream
}

// peerOf is the rank at the other end of rank's link in direction d, in a
// ring of n.
func peerOf(rank, n int, d mesh.Dir) int {
	if d == mesh.Upstream {
		return (rank + n - 1) % n
	}
	return (rank + 1) % n
}

// stalledStep returns the id of a step in flight launched more than
// timeout before now (the ring is stuck), if any.
func stalledStep(launched map[uint64]time.Time, now time.Time, timeout time.Duration) (uint64, bool) {
	for id, t := range launched {
		if now.Sub(t) > timeout {
			return id, true
		}
	}
	return 0, false
}

// formAction is what a rank does with a Form message of epoch msg, when
// its own epoch is mine.
type formAction int

const (
	formIgnore     formAction = iota // the head: not its current ring, or formed already
	formRingFormed                   // the head: its Form came back around: the ring is formed
	formJoin                         // another rank: take the ring (and pass the Form on)
	formJoinReset                    // another rank: a new ring; drop the sequences of the old one first
)

func onFormAction(head, formed bool, msg, mine uint64, holding int) formAction {
	switch {
	case head && msg == mine && !formed:
		return formRingFormed
	case head:
		return formIgnore
	case msg != mine && holding > 0:
		return formJoinReset
	}
	return formJoin
}

// startable reports whether an admitted sequence can start stepping: a
// local one at once, a remote one once every one of the ranks holds its
// verified state.
func startable(remote bool, ready, ranks int) bool {
	return !remote || ready == ranks
}

// tickAction is what the head does on a tick of its timer.
type tickAction int

const (
	tickNone  tickAction = iota
	tickForm             // the ring is not formed: send the Form again
	tickReset            // a step is stalled: reset the ring
)

// onTickAction is the head's tick: before the ring is formed it retries
// the Form; after, it resets the ring when a step launched more than
// timeout before now has not come back (the step, for the error).
func onTickAction(formed bool, launched map[uint64]time.Time, now time.Time, timeout time.Duration) (tickAction, uint64) {
	if !formed {
		return tickForm, 0
	}
	if id, ok := stalledStep(launched, now, timeout); ok {
		return tickReset, id
	}
	return tickNone, 0
}

// slotDue reports whether the head steps a decode slot: it has members
// and no step in flight.
func slotDue(inflight bool, members int) bool {
	return !inflight && members > 0
}

// cancelAction is what Cancel does on the head's loop.
type cancelAction int

const (
	cancelDone      cancelAction = iota // a step dropped the sequence and ended it already
	cancelUnknown                       // no such sequence: an error, and its mark goes
	cancelAdmitting                     // ends as cancelled when its admission completes
	cancelEnd                           // ends now, as cancelled
)

// onCancelAction is the rule for a Cancel of a sequence: held says the head
// holds it, admitting that its admission is going around the ring, ended
// that a step that dropped it ended it.
func onCancelAction(held, admitting, ended bool) cancelAction {
	switch {
	case !held && ended:
		return cancelDone
	case !held:
		return cancelUnknown
	case admitting:
		return cancelAdmitting
	}
	return cancelEnd
}
