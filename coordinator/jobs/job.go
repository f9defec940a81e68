// Package jobs is the job lifecycle as the coordinator keeps it: the
// states a job goes through, the rules between them, the events that
// announce each step, the timing breakdown of a finished job, and a table
// of jobs for listing. It is pure logic: no NATS, no clocks of its own
// (every time is passed in).
package jobs

import (
	"fmt"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// rank orders the non-final states; a job only moves forward.
var rank = map[cp.JobState]int{
	cp.StateQueued: 0, cp.StateRouted: 1, cp.StatePrefilling: 2, cp.StateTransferring: 3, cp.StateDecoding: 4,
}

// Marks are the moments the coordinator observed in a job's life; the
// driver sets them as reports arrive, and Timing turns them into the
// breakdown. A zero mark was not observed.
type Marks struct {
	// PassStarted: the prefill worker's weight pass that took the job
	// started (remote). PrefillDone: its last layer was computed.
	// Committed: every decode rank holds the transferred state.
	PassStarted, PrefillDone, Committed time.Time
	// FirstToken and LastToken: the decode group's first and last token.
	FirstToken, LastToken time.Time
	// Decode is the decode group's own measure of first to last token,
	// when it reported one (it excludes the hop to the coordinator).
	Decode       time.Duration
	OutputTokens int
	// CachedTokens of the prompt came from the prefix cache of worker
	// CachedOn.
	CachedTokens int
	CachedOn     string
	// Speculation is the decode group's account of its speculative
	// decoding, when it gave one.
	Speculation *cp.Speculation
}

// Job is one job's lifecycle. It is owned by one goroutine (the job's
// driver); the Table keeps copies of its events for everyone else.
type Job struct {
	ID        string
	Submitted time.Time
	// PromptTokens is the prompt's length in tokens (0 until tokenized).
	PromptTokens int
	Marks        Marks

	state   cp.JobState
	seq     uint64
	entered map[cp.JobState]time.Time
	route   *cp.RouteDecision
	last    cp.JobEvent
}

// New is a job accepted at submitted, in state queued (no event yet: see
// Queued).
func New(id string, submitted time.Time, promptTokens int) *Job {
	return &Job{ID: id, Submitted: submitted, PromptTokens: promptTokens, state: cp.StateQueued,
		entered: map[cp.JobState]time.Time{cp.StateQueued: submitted}}
}

// State is the job's current state.
func (j *Job) State() cp.JobState { return j.state }

// Route is the routing decision, nil before routed.
func (j *Job) Route() *cp.RouteDecision { return j.route }

// Entered is when the job entered state s (zero if it never did).
func (j *Job) Entered(s cp.JobState) time.Time { return j.entered[s] }

// Last is the latest event (zero before the first).
func (j *Job) Last() cp.JobEvent { return j.last }

// Update carries what an event says besides its state.
type Update struct {
	Detail   string
	Progress *cp.LayerProgress
	Route    *cp.RouteDecision // required when entering routed
	Err      *cp.JobError      // required when entering failed
	Output   *cp.Output        // final states: what the job generated
}

// Queued is the job's first event.
func (j *Job) Queued(detail string) cp.JobEvent {
	return j.event(cp.StateQueued, j.Submitted, Update{Detail: detail})
}

// Advance moves the job to state to at time at and returns the event that
// announces it. A job moves forward only: queued, routed, prefilling,
// transferring (remote jobs only), decoding, then one final state;
// prefilling and transferring may repeat (progress), and routed may repeat
// before prefilling (the job is routed again when the chosen workers turn
// it down). A final state can be entered from any other state, once.
func (j *Job) Advance(to cp.JobState, at time.Time, u Update) (cp.JobEvent, error) {
	if err := j.check(to, u); err != nil {
		return cp.JobEvent{}, fmt.Errorf("job %s: %w", j.ID, err)
	}
	if to == cp.StateRouted {
		r := *u.Route
		j.route = &r
	}
	if j.state != to || to == cp.StateRouted {
		j.entered[to] = at // a job routed again counts from its last route
	}
	j.state = to
	return j.event(to, at, u), nil
}

func (j *Job) check(to cp.JobState, u Update) error {
	switch {
	case !to.Valid():
		return fmt.Errorf("%q is not a lifecycle state", to)
	case j.state.Final():
		return fmt.Errorf("is %s already, cannot become %s", j.state, to)
	case to.Final():
		if to == cp.StateFailed && u.Err == nil {
			return fmt.Errorf("failed without a reason")
		}
		return nil
	case to == cp.StateQueued:
		return fmt.Errorf("cannot go back to queued from %s", j.state)
	case to == cp.StateRouted && u.Route == nil:
		return fmt.Errorf("routed without a routing decision")
	case to != cp.StateRouted && j.route == nil:
		return fmt.Errorf("cannot become %s before it is routed", to)
	case to == cp.StateTransferring && j.route.Target != cp.TargetRemote:
		return fmt.Errorf("a job routed %s has no transfer", j.route.Target)
	case rank[to] < rank[j.state], rank[to] == rank[j.state] && to != cp.StateRouted && to != cp.StatePrefilling && to != cp.StateTransferring:
		return fmt.Errorf("cannot go from %s to %s", j.state, to)
	}
	return nil
}

func (j *Job) event(s cp.JobState, at time.Time, u Update) cp.JobEvent {
	j.seq++
	ev := cp.JobEvent{JobID: j.ID, Seq: j.seq, State: s, Time: at, Submitted: j.Submitted, Detail: u.Detail,
		Progress: u.Progress, Error: u.Err}
	if s.Final() {
		ev.Output = u.Output
	}
	if j.route != nil {
		r := *j.route
		ev.Route = &r
	}
	if s.Final() {
		t := j.Timing(at)
		ev.Timing = &t
	}
	j.last = ev
	return ev
}

// Timing is the breakdown of where the job's time went, up to end.
func (j *Job) Timing(end time.Time) cp.Timing {
	m := &j.Marks
	since := func(a, b time.Time) time.Duration {
		if a.IsZero() || b.IsZero() || b.Before(a) {
			return 0
		}
		return b.Sub(a)
	}
	routed := j.entered[cp.StateRouted]
	t := cp.Timing{Queue: since(j.Submitted, routed), FirstToken: since(j.Submitted, m.FirstToken),
		Total: since(j.Submitted, end), PromptTokens: j.PromptTokens, OutputTokens: m.OutputTokens,
		CachedTokens: m.CachedTokens, CachedOn: m.CachedOn, Speculation: m.Speculation}
	if j.route != nil && j.route.Target == cp.TargetRemote {
		t.PassWait = since(routed, m.PassStarted)
		t.Prefill = since(m.PassStarted, m.PrefillDone)
		t.TransferTail = since(m.PrefillDone, m.Committed)
	} else {
		// The decode group prefills the prompt and runs its first step
		// before the first token: that is the local prefill.
		t.Prefill = since(j.entered[cp.StatePrefilling], m.FirstToken)
	}
	t.Decode = m.Decode
	if t.Decode == 0 {
		t.Decode = since(m.FirstToken, m.LastToken)
	}
	if m.OutputTokens > 1 && t.Decode > 0 {
		t.DecodeTokensPerSec = float64(m.OutputTokens-1) / t.Decode.Seconds()
	}
	return t
}
