// Package jobrun is one delivery of a job as the coordinator drives it,
// written as a pure state machine: events go in (the delivery, what the
// workers say of the job, the placement found, the answers to the
// assignments, the workers' reports, a lost worker, a cancellation, the
// clock), actions come out (publish an event, ask the workers, assign,
// cancel, observe a rate, settle the delivery in the queue). It does no
// I/O and reads no clock: the coordinator's driver (coordinator/service)
// carries out the actions and feeds back their results, and the tests
// feed events one at a time.
//
// Exactly once across coordinator crashes: a job delivered again (its
// coordinator died, or handed it back) first asks the workers what they
// know of it (Inquire). A decode group that holds it, or ended it
// recently, is adopted: the job is followed to its end, or reported as it
// ended, and never assigned a second time. Workers admit a job id once,
// so an assignment that reaches a worker already holding the job is
// answered Resumed and adopted the same way.
//
// Reports are core NATS messages: one published as a server dies, or while
// the coordinator's connection is down, is lost. So a run never fails a
// job for silence alone: before it does, and after its connection came
// back, it asks the decode group (Check). A group still producing tokens
// keeps the job; one that ended it hands over its final report, output
// included; one that does not know the job, or holds it without a new
// token since the last report, fails it.
package jobrun

import (
	"fmt"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/jobs"
)

// Config holds the limits of a run. Zero durations take the defaults named.
type Config struct {
	// Layers is the model's layer count (the progress of a remote job).
	Layers int
	// PlacementWait bounds the wait for workers with room (default 60 s).
	PlacementWait time.Duration
	// StallTimeout fails a decoding job silent that long (default 2 min).
	StallTimeout time.Duration
	// JobTimeout bounds a job from submission to its end (default 2 h).
	JobTimeout time.Duration
	// ShutdownGrace is how long a running job may go on after the
	// coordinator began to stop (default 30 s).
	ShutdownGrace time.Duration
	// RetryPause is the pause before placing a job again after workers
	// turned it down (default 250 ms).
	RetryPause time.Duration
}

func (c Config) withDefaults() Config {
	for _, x := range []struct {
		p *time.Duration
		v time.Duration
	}{{&c.PlacementWait, time.Minute}, {&c.StallTimeout, 2 * time.Minute}, {&c.JobTimeout, 2 * time.Hour},
		{&c.ShutdownGrace, 30 * time.Second}, {&c.RetryPause, 250 * time.Millisecond}} {
		if *x.p <= 0 {
			*x.p = x.v
		}
	}
	return c
}

type phase int

const (
	phaseNew       phase = iota
	phaseInquiring       // asking the workers about a job delivered again
	phasePlacing         // waiting for workers with room
	phaseAssigning       // an assignment is out
	phaseFollowing       // assigned (or adopted): following the reports
	phaseEnded           // final, or handed back
)

// check is why a Check is out.
type check int

const (
	checkNone   check = iota
	checkStall        // the decode group went silent for StallTimeout
	checkResync       // the coordinator's connection came back
)

// Machine is one delivery of one job. It is not safe for concurrent use:
// one driver owns it.
type Machine struct {
	cfg    Config
	job    *jobs.Job
	prompt int
	policy cp.Policy
	phase  phase

	// Placement.
	exclude         map[string]bool // prefill workers that did not answer
	refused         string          // why the last try did not place the job
	placeBy         time.Time
	retryAt         time.Time
	plan            *Plan
	prefillAssigned bool      // the plan's prefill assignment is the one out
	sentDecode      time.Time // when the decode assignment went out

	// Following.
	deadline, stallAt, graceAt time.Time
	group, head, prefill       string
	involved                   map[string]time.Time // worker -> when it got the job
	prefillOpen, decodeOpen    bool
	adopted                    bool
	reinquired                 bool // asked the workers again after a Resumed answer
	decoded                    int  // tokens the head last reported
	checking                   check
	// left is a worker holding the job that deregistered; its final
	// report has until leftBy to come.
	left, leftWhy string
	leftBy        time.Time

	final *cp.JobEvent
	acts  []Action
}

// New is a run of job id, submitted at submitted, with a prompt of prompt
// tokens (after admission) and routing policy policy.
func New(cfg Config, id string, submitted time.Time, prompt int, policy cp.Policy) *Machine {
	j := jobs.New(id, submitted, prompt)
	j.Queued("") // announced at submission
	return &Machine{cfg: cfg.withDefaults(), job: j, prompt: prompt, policy: policy,
		exclude: map[string]bool{}, involved: map[string]time.Time{}}
}

// Job is the job's lifecycle as the run keeps it.
func (m *Machine) Job() *jobs.Job { return m.job }

// Ended reports whether the run is over: its delivery settled (Settle was
// emitted).
func (m *Machine) Ended() bool { return m.phase == phaseEnded }

// Final is the job's final event, nil before it or when the run handed the
// job back.
func (m *Machine) Final() *cp.JobEvent { return m.final }

// Speaks reports whether worker speaks for the job: it is the decode
// group's head or the prefill worker the job was assigned to (or adopted
// from). Reports of any other worker are ignored.
func (m *Machine) Speaks(worker string) bool {
	return worker != "" && (worker == m.head || worker == m.prefill)
}

// Next is when the run next needs a Tick (zero: no timer runs).
func (m *Machine) Next() time.Time {
	var next time.Time
	for _, t := range []time.Time{m.placeBy, m.retryAt, m.deadline, m.stallAt, m.graceAt, m.leftBy} {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}

// Step applies one event and returns the actions it calls for, in order.
func (m *Machine) Step(ev Event) []Action {
	m.acts = nil
	if m.phase == phaseEnded {
		if _, ok := ev.(Cancel); ok {
			state := cp.StateCancelled
			if m.final != nil {
				state = m.final.State
			}
			m.emit(ReplyCancel{State: state, Late: true})
		}
		return m.acts
	}
	switch e := ev.(type) {
	case Start:
		m.start(e)
	case Inquired:
		m.inquired(e)
	case Candidate:
		m.candidate(e)
	case Assigned:
		m.assigned(e)
	case Report:
		m.report(e)
	case WorkerLost:
		m.lost(e)
	case Checked:
		m.checked(e)
	case Reconnected:
		if m.phase == phaseFollowing && m.decodeOpen && m.checking == checkNone {
			m.checking = checkResync
			m.emit(Check{Worker: m.head})
		}
	case WorkersChanged:
		if m.phase == phasePlacing && m.retryAt.IsZero() {
			m.emit(Place{Exclude: m.excluded()})
		}
	case Cancel:
		m.cancel(e)
	case Tick:
		m.tick(e.At)
	case Shutdown:
		m.shutdown(e.At)
	default:
		panic(fmt.Sprintf("jobrun: unknown event %T", ev))
	}
	return m.acts
}

func (m *Machine) emit(a ...Action) { m.acts = append(m.acts, a...) }

func (m *Machine) excluded() []string {
	var out []string
	for id := range m.exclude {
		out = append(out, id)
	}
	return out
}

func (m *Machine) start(e Start) {
	d := e.Delivery
	m.deadline = m.job.Submitted.Add(m.cfg.JobTimeout)
	switch {
	case d.Cancelled != "":
		m.end(e.At, cp.StateCancelled, jobs.Update{Detail: "cancelled while queued", Err: &cp.JobError{Message: d.Cancelled}})
	case d.LastAttempt && d.NumDelivered > 1:
		m.fail(e.At, &cp.JobError{Code: cp.CodeInternal, Message: fmt.Sprintf(
			"delivered %d times without reaching a final state (its coordinators stopped while running it); given up", d.NumDelivered)})
	case d.Refused != nil:
		// Stored by a coordinator with other limits, or another model.
		m.fail(e.At, d.Refused)
	case d.NumDelivered > 1:
		// An earlier delivery may have assigned the job: ask the workers
		// before anything is assigned again.
		m.phase = phaseInquiring
		m.emit(Inquire{})
	default:
		m.startPlacing(e.At)
	}
}

func (m *Machine) startPlacing(at time.Time) {
	m.phase = phasePlacing
	m.placeBy = at.Add(m.cfg.PlacementWait)
	m.emit(Place{Exclude: m.excluded()})
}

// inquired adopts what an earlier delivery left running or ended, or
// places the job afresh when no worker has it.
func (m *Machine) inquired(e Inquired) {
	if m.phase != phaseInquiring {
		return
	}
	var dec, pre *WorkerReport
	silentPrefill := false
	for i := range e.Reports {
		r := &e.Reports[i]
		silentPrefill = silentPrefill || (r.Reply == nil && r.Kind == cp.KindPrefill)
		if r.Reply == nil || !(r.Reply.Held || r.Reply.Finished()) || (r.Reply.Finished() && r.Reply.Progress.Stage == cp.StateCancelled) {
			continue // not there, or cancelled there (handed back): may run again
		}
		switch {
		case r.Kind == cp.KindDecode && dec == nil:
			dec = r
		case r.Kind == cp.KindPrefill && pre == nil:
			pre = r
		}
	}
	switch {
	case dec != nil && pre == nil && silentPrefill && !m.reinquired:
		// A prefill worker did not answer (it, or this coordinator, was
		// reconnecting): it may have prefilled the job. Ask once more
		// after a pause, so that the adopted route says so.
		m.reinquired = true
		m.retryAt = e.At.Add(m.cfg.RetryPause)
	case dec != nil:
		m.adopt(e.At, dec.Worker, dec.Group, dec.Ranks, dec.Reply.Progress, pre, silentPrefill)
	case pre != nil && pre.Reply.Held:
		// Its decode group lost the job (restarted): the prefill has
		// nowhere to go. Stop it, and run the job afresh.
		m.emit(CancelOn{Workers: []string{pre.Worker}, Reason: "its decode group no longer holds the job"})
		m.startPlacing(e.At)
	default:
		m.startPlacing(e.At)
	}
}

// adopt takes over a job that decode group head (of group, with ranks)
// holds or ended, as p reports it; pre is the prefill worker's account of
// it (nil: none; silent: a prefill worker did not answer).
func (m *Machine) adopt(at time.Time, head, group string, ranks []string, p *cp.Progress, pre *WorkerReport, silent bool) {
	m.adopted = true
	m.group, m.head = group, head
	target := cp.TargetLocal
	reason := fmt.Sprintf("adopted: an earlier delivery of the job assigned it to decode group %s, which has it", group)
	switch {
	case pre != nil:
		target = cp.TargetRemote
		m.prefill = pre.Worker
	case silent:
		// The route says local, the only path it can name without a
		// prefill worker; the reason says what is not known.
		reason += "; a prefill worker did not answer, so whether the job was prefilled there is not known"
	}
	rd := &cp.RouteDecision{Policy: m.policy, Target: target, DecodeGroup: group, PrefillWorker: m.prefill, Reason: reason}
	m.advance(at, cp.StateRouted, jobs.Update{Route: rd, Detail: rd.Reason})
	m.phase = phaseFollowing
	m.placeBy, m.retryAt = time.Time{}, time.Time{} // placed
	for _, id := range ranks {
		m.involved[id] = at
	}
	m.involved[head] = at
	m.decodeOpen = true
	if pre != nil {
		m.involved[pre.Worker] = at
		m.prefillOpen = pre.Reply.Held
		if !pre.Reply.Held {
			m.report(Report{At: at, P: pre.Reply.Progress, prefillOpen: true})
			if m.phase == phaseEnded {
				return
			}
		}
	}
	if p == nil {
		p = &cp.Progress{JobID: m.job.ID, WorkerID: head, Stage: cp.StatePrefilling, Time: at}
	}
	switch {
	case p.Stage.Final():
		m.report(Report{At: at, P: p})
	case p.Stage == cp.StateDecoding:
		m.report(Report{At: at, P: p})
	case m.prefillOpen && pre.Reply.Progress != nil:
		m.advance(at, cp.StatePrefilling, jobs.Update{Detail: "adopted while prefilling"})
		m.report(Report{At: at, P: pre.Reply.Progress})
	default:
		m.advance(at, cp.StatePrefilling, jobs.Update{Detail: "adopted before its first token"})
	}
}

func (m *Machine) candidate(e Candidate) {
	if m.phase != phasePlacing {
		return
	}
	if e.Unreachable != "" {
		m.exclude[e.Unreachable] = true // under policy auto, the next try goes local
	}
	if e.Plan == nil {
		m.refused = e.Why
		if e.Unreachable != "" {
			m.retryAt = e.At.Add(m.cfg.RetryPause)
		}
		return
	}
	p := e.Plan
	m.plan, m.prefillAssigned, m.sentDecode = p, false, e.At
	// Announced before the assignments go out: the routed event marks the
	// end of the control plane's own work on the job.
	m.advance(e.At, cp.StateRouted, jobs.Update{Route: p.Route, Detail: p.Route.Reason})
	m.phase = phaseAssigning
	m.emit(Assign{Worker: p.Head, Assignment: p.Decode})
}

func (m *Machine) assigned(e Assigned) {
	if m.phase != phaseAssigning {
		return
	}
	p := m.plan
	prefill := m.prefillAssigned
	worker := p.Head
	if prefill {
		worker = p.Prefill
	}
	// again: the workers turned the job down for now; a decode group that
	// admitted it is not tried again under the same id, so a prefill side
	// that fails then fails the job.
	again := func(why string) {
		m.refused = why
		if prefill {
			m.fail(e.At, &cp.JobError{Code: cp.CodeUnavailable, Worker: worker,
				Message: "did not take the job after the decode group had admitted it"})
			m.emit(CancelOn{Workers: []string{p.Head}, Reason: "the prefill worker did not take the job"})
			return
		}
		m.phase = phasePlacing
		m.retryAt = e.At.Add(m.cfg.RetryPause)
	}
	rep := e.Reply
	switch {
	case e.NoResponders:
		// Nobody took the request: the worker is gone (the registry will
		// say so) or not serving yet.
		again(fmt.Sprintf("worker %s does not serve assignments (gone, or not started yet)", worker))
	case e.Lost != "":
		// Whatever it took died with it. A decode group's rank 0 may have
		// streamed tokens before its answer went out: the job is not
		// tried again, it fails as a loss while following would.
		if prefill {
			m.emit(CancelOn{Workers: []string{p.Head}, Reason: fmt.Sprintf("prefill worker %s was lost", worker)})
		}
		m.fail(e.At, &cp.JobError{Code: cp.CodeUnavailable, Worker: worker, Message: e.Lost})
	case e.Err != nil:
		// It may have been taken after all: make sure it is not kept (a
		// worker drops a job cancelled while it is being admitted).
		cancel := []string{worker}
		if prefill {
			cancel = append(cancel, p.Head)
		}
		m.emit(CancelOn{Workers: cancel, Reason: "the assignment was not answered in time"})
		m.fail(e.At, &cp.JobError{Code: cp.CodeUnavailable, Worker: worker,
			Message: fmt.Sprintf("did not answer the assignment in time: %v", e.Err)})
	case rep == nil:
		panic("jobrun: Assigned without a reply, an error, NoResponders or Lost")
	case !rep.Accepted && (rep.Code == cp.CodeUnavailable || rep.Code == cp.CodeConflict):
		again(fmt.Sprintf("worker %s: %s", worker, rep.Error))
	case !rep.Accepted:
		if prefill {
			m.emit(CancelOn{Workers: []string{p.Head}, Reason: "the prefill worker did not take the job"})
		}
		m.fail(e.At, &cp.JobError{Code: rep.Code, Worker: worker, Message: "refused the assignment: " + rep.Error})
	case rep.Resumed && !prefill && !m.reinquired:
		// The decode group has the job from an earlier delivery, which
		// the inquiry missed (a worker or this coordinator was
		// reconnecting). Send the prefill worker nothing (its new
		// transfer session would be one the group does not expect) and
		// ask again, once, to learn how that delivery ran it (a remote
		// job's prefill worker).
		m.reinquired = true
		m.phase = phaseInquiring
		m.emit(Inquire{})
	case rep.Resumed && !prefill:
		m.adopt(e.At, p.Head, p.Group, p.Ranks, rep.Progress, nil, false)
	case !prefill && p.Prefill != "":
		m.prefillAssigned = true
		// The prefill worker sends the state after the rows the group took
		// as its base (none: the whole state).
		pa := *p.PrefillAssignment
		pa.AppendTokens = rep.AppendTokens
		m.emit(Assign{Worker: p.Prefill, Assignment: &pa})
	default:
		m.placed(e.At, rep)
	}
}

// placed follows a job both sides took.
func (m *Machine) placed(at time.Time, rep *cp.AssignReply) {
	p := m.plan
	remote := p.Prefill != ""
	m.phase = phaseFollowing
	m.placeBy, m.retryAt = time.Time{}, time.Time{}
	m.group, m.head, m.decodeOpen = p.Group, p.Head, true
	for _, id := range p.Ranks {
		m.involved[id] = m.sentDecode
	}
	m.involved[p.Head] = m.sentDecode
	u := jobs.Update{Detail: fmt.Sprintf("decode group %s prefills %d tokens", p.Group, m.prompt)}
	if remote {
		m.prefill, m.prefillOpen = p.Prefill, true
		m.involved[p.Prefill] = at
		m.emit(LoadPrefill{Worker: p.Prefill, Tokens: m.prompt - 1})
		u = jobs.Update{Detail: fmt.Sprintf("prefill worker %s prefills %d tokens", p.Prefill, m.prompt-1),
			Progress: &cp.LayerProgress{Done: 0, Total: m.cfg.Layers}}
	} else {
		m.emit(LoadLocal{Group: p.Group, Tokens: m.prompt})
	}
	m.emit(AssignedAt{Latency: at.Sub(m.job.Submitted)})
	// A local prefill starts as the group admits the job; a remote one as
	// the prefill worker takes it.
	started := m.sentDecode
	if remote {
		started = at
	}
	m.advance(started, cp.StatePrefilling, u)
	if remote && rep.Resumed && rep.Progress != nil {
		// The prefill worker had the job already (an earlier delivery).
		m.report(Report{At: at, P: rep.Progress})
	}
}

func (m *Machine) report(e Report) {
	if m.phase != phaseFollowing || e.P == nil {
		return
	}
	p := e.P
	switch p.WorkerID {
	case m.prefill:
		if m.prefillOpen || e.prefillOpen {
			m.onPrefill(p, e.At)
		}
	case m.head:
		if m.decodeOpen {
			m.onDecode(p, e.At)
		}
	}
}

// onPrefill applies a report of the prefill worker.
func (m *Machine) onPrefill(p *cp.Progress, at time.Time) {
	mk := &m.job.Marks
	if mk.PassStarted.IsZero() && p.Elapsed > 0 && !m.adopted {
		mk.PassStarted = at.Add(-p.Elapsed)
	}
	switch p.Stage {
	case cp.StatePrefilling:
		if p.Layers != nil {
			m.emit(LoadProgress{Worker: m.prefill, Done: p.Layers.Done, Total: p.Layers.Total})
		}
		if m.job.State() == cp.StatePrefilling {
			m.advance(at, cp.StatePrefilling, jobs.Update{Progress: p.Layers,
				Detail: fmt.Sprintf("%d of %d prompt tokens prefilled", p.Tokens, m.prompt-1)})
		}
	case cp.StateTransferring:
		mk.PrefillDone = at
		if p.Cached > 0 && p.Cached < m.prompt {
			// Resumed from the prefill worker's prefix store (said before
			// the last layer leaves, so before the first token).
			mk.CachedTokens, mk.CachedOn = p.Cached, p.WorkerID
		}
		m.emit(LoadForget{}) // off the prefill worker's queue
		if m.job.State() == cp.StatePrefilling || m.job.State() == cp.StateRouted {
			m.advance(at, cp.StateTransferring, jobs.Update{Progress: p.Layers,
				Detail: "prefill done; the last layers' state is in transfer"})
		}
	case cp.StateDone:
		m.prefillOpen = false
		if p.Cached > 0 && p.Cached < m.prompt {
			// Resumed from the prefill worker's prefix store.
			mk.CachedTokens, mk.CachedOn = p.Cached, p.WorkerID
		}
		if mk.PrefillDone.IsZero() {
			mk.PrefillDone = at
		}
		if mk.Committed.IsZero() || at.Before(mk.Committed) {
			mk.Committed = at
		}
		if mr := p.Measured; mr != nil {
			if mr.PrefillTokensPerSec > 0 && p.Tokens > 0 {
				compute := time.Duration(float64(p.Tokens) / mr.PrefillTokensPerSec * float64(time.Second))
				m.emit(ObservePass{Floor: mr.PassFloor, Compute: compute, Tokens: p.Tokens})
			}
			if mr.LinkBytesPerSec > 0 {
				m.emit(ObserveTransfer{BytesPerSec: int64(mr.LinkBytesPerSec)})
			}
		}
	case cp.StateFailed, cp.StateCancelled:
		m.prefillOpen = false
		m.cancelWorkers("the prefill side ended")
		m.fail(at, SideError(p, "cancelled the job"))
	}
}

// onDecode applies a report of the decode group's head.
func (m *Machine) onDecode(p *cp.Progress, at time.Time) {
	mk := &m.job.Marks
	switch p.Stage {
	case cp.StateDecoding:
		m.stallAt = at.Add(m.cfg.StallTimeout)
		m.decoded = max(m.decoded, p.Tokens)
		if m.job.State() != cp.StateDecoding {
			if !m.adopted {
				mk.FirstToken = at
				if m.prefill != "" && mk.Committed.IsZero() {
					mk.Committed = at // at the latest; the prefill worker's report may still come
				}
			}
			m.emit(LoadForget{})
			detail := "first token"
			if m.adopted {
				detail = fmt.Sprintf("adopted while decoding (%d tokens so far)", p.Tokens)
			}
			m.advance(at, cp.StateDecoding, jobs.Update{Detail: detail})
		}
	case cp.StateDone:
		m.decodeOpen = false
		mk.LastToken, mk.OutputTokens, mk.Decode = at, p.Tokens, p.Elapsed
		if sp := p.Speculation; sp != nil {
			c := *sp
			mk.Speculation = &c
		}
		if p.Cached > 0 && p.Cached < m.prompt {
			mk.CachedTokens, mk.CachedOn = p.Cached, p.WorkerID
		}
		if mr := p.Measured; mr != nil {
			if mr.DecodeTokensPerSec > 0 {
				m.emit(ObserveDecodeStep{Step: time.Duration(float64(time.Second) / mr.DecodeTokensPerSec)})
			}
			if mr.PrefillTokensPerSec > 0 && m.prefill == "" && !m.adopted {
				n := m.prompt - mk.CachedTokens // the cached prefix was not prefilled
				m.emit(ObserveLocalPrefill{Tokens: n, Time: time.Duration(float64(n) / mr.PrefillTokensPerSec * float64(time.Second))})
			}
		}
		// Decoding needs the committed state: the prefill side is done.
		m.prefillOpen = false
		detail := fmt.Sprintf("%d tokens", p.Tokens)
		if m.adopted {
			detail += " (adopted: the job ran once, under an earlier delivery)"
		}
		m.end(at, cp.StateDone, jobs.Update{Detail: detail, Output: p.Output})
	case cp.StateFailed, cp.StateCancelled:
		m.decodeOpen = false
		mk.OutputTokens = p.Tokens
		m.cancelWorkers("the decode side ended")
		je := SideError(p, "ended the job")
		m.end(at, cp.StateFailed, jobs.Update{Err: je, Output: p.Output})
	}
}

// SideError is the job's error when a worker ends its side of the job:
// the worker's own error, or, when it has none or cancelled, one saying
// that it did (what, in verb), naming the worker.
func SideError(p *cp.Progress, verb string) *cp.JobError {
	je := p.Error
	if je == nil || p.Stage == cp.StateCancelled {
		msg := verb + " on its own"
		if je != nil {
			msg = verb + ": " + je.Message
		}
		je = &cp.JobError{Code: cp.CodeUnavailable, Worker: p.WorkerID, Message: msg}
	}
	if je.Worker == "" {
		je.Worker = p.WorkerID
	}
	return je
}

func (m *Machine) lost(e WorkerLost) {
	if m.phase != phaseFollowing {
		return
	}
	sent, ok := m.involved[e.Worker]
	if !ok || sent.After(e.Since) {
		// Not ours, or a worker that restarted before the job was sent
		// to it (workers register before they serve): it holds the job.
		return
	}
	if e.Worker == m.prefill && !m.prefillOpen {
		// Its part is over (it reported the state committed, or the
		// group decodes): a drained prefill worker leaving changes
		// nothing for the job.
		return
	}
	if e.Left && m.decodeOpen && m.left == "" {
		// A clean exit: the worker published its final report before it
		// deregistered, and the report may be read after this. The
		// decode group's head settles the job (it decodes once the whole
		// state is committed; it fails the job when its transfer session
		// or ring breaks); the head's own report is waited for, a while.
		m.left, m.leftWhy, m.leftBy = e.Worker, e.Reason, e.At.Add(m.cfg.StallTimeout)
		return
	}
	m.cancelWorkers(fmt.Sprintf("worker %s was lost", e.Worker), e.Worker)
	m.fail(e.At, &cp.JobError{Code: cp.CodeUnavailable, Worker: e.Worker, Message: e.Reason})
}

// checked adopts the decode group's account of the job, asked for by a
// Check.
func (m *Machine) checked(e Checked) {
	why := m.checking
	m.checking = checkNone
	if m.phase != phaseFollowing || why == checkNone {
		return
	}
	stalled := why == checkStall
	rep := e.Reply
	if e.Err == nil && rep != nil && rep.WorkerID != m.head {
		e.Err = fmt.Errorf("the answer is from worker %s, not the group's head %s", rep.WorkerID, m.head)
	}
	var p *cp.Progress
	if e.Err == nil && rep != nil && rep.Progress != nil && rep.Progress.WorkerID == m.head {
		p = rep.Progress
	}
	switch {
	case p != nil && rep.Finished():
		// It ended and the report was lost: its final report carries the
		// whole output.
		m.report(Report{At: e.At, P: p})
	case p != nil && rep.Held && p.Stage == cp.StateDecoding && p.Tokens > m.decoded:
		// Decoding on: only the reports were lost.
		m.report(Report{At: e.At, P: p})
	case !stalled:
		// After a reconnection, anything else leaves the timers as they
		// are: the group may not have reported yet.
	case e.Err != nil:
		m.stallFail(e.At, fmt.Sprintf("and it does not answer for the job: %v", e.Err))
	case rep == nil || !rep.Held:
		m.stallFail(e.At, "and it no longer knows the job")
	default:
		m.stallFail(e.At, fmt.Sprintf("and it holds the job with no token since (%d so far)", m.decoded))
	}
}

// stallFail fails a job whose decode group went silent; more says what the
// group answered when asked.
func (m *Machine) stallFail(at time.Time, more string) {
	m.cancelWorkers("the decode group went silent")
	m.fail(at, &cp.JobError{Code: cp.CodeUnavailable, Worker: m.head,
		Message: fmt.Sprintf("no report from the decode group for %v while decoding, %s", m.cfg.StallTimeout, more)})
}

func (m *Machine) cancel(e Cancel) {
	switch m.phase {
	case phaseFollowing:
		m.cancelWorkers(e.Reason)
		m.end(e.At, cp.StateCancelled, jobs.Update{Err: &cp.JobError{Message: e.Reason}})
	default:
		m.end(e.At, cp.StateCancelled, jobs.Update{Detail: "cancelled before it was assigned", Err: &cp.JobError{Message: e.Reason}})
	}
	m.emit(ReplyCancel{State: cp.StateCancelled})
}

func (m *Machine) tick(now time.Time) {
	switch m.phase {
	case phaseInquiring:
		if !m.retryAt.IsZero() && !now.Before(m.retryAt) {
			m.retryAt = time.Time{}
			m.emit(Inquire{})
		}
	case phasePlacing:
		if !m.placeBy.IsZero() && !now.Before(m.placeBy) {
			m.fail(now, &cp.JobError{Code: cp.CodeUnavailable, Message: fmt.Sprintf("not placed within %v: %s", m.cfg.PlacementWait, m.refused)})
			return
		}
		if !m.retryAt.IsZero() && !now.Before(m.retryAt) {
			m.retryAt = time.Time{}
			m.emit(Place{Exclude: m.excluded()})
		}
	case phaseFollowing:
		switch {
		case !m.leftBy.IsZero() && !now.Before(m.leftBy):
			m.leftBy = time.Time{}
			m.leftGone(now)
		case !m.graceAt.IsZero() && !now.Before(m.graceAt):
			m.cancelWorkers("the coordinator stopped; the job goes back to the queue")
			m.release()
		case !m.stallAt.IsZero() && !now.Before(m.stallAt):
			// Silent, or its reports lost: ask before failing it.
			m.stallAt = time.Time{}
			m.checking = checkStall
			m.emit(Check{Worker: m.head})
		case !now.Before(m.deadline):
			m.cancelWorkers("job timeout")
			m.fail(now, &cp.JobError{Code: cp.CodeUnavailable, Message: fmt.Sprintf("the job did not finish within %v of its submission (job timeout)", m.cfg.JobTimeout)})
		}
	}
}

// leftGone settles the side of a worker that deregistered while holding
// the job, once its final report had time to come.
func (m *Machine) leftGone(now time.Time) {
	switch {
	case m.left == m.prefill && !m.prefillOpen, m.left == m.head && !m.decodeOpen:
		return // its report came
	case m.left == m.prefill && m.job.State() == cp.StateDecoding:
		m.prefillOpen = false // the group decodes: the state was committed
		return
	case m.left != m.prefill && m.left != m.head:
		return // another rank: the head settles the job
	}
	m.cancelWorkers(fmt.Sprintf("worker %s was lost", m.left), m.left)
	m.fail(now, &cp.JobError{Code: cp.CodeUnavailable, Worker: m.left,
		Message: fmt.Sprintf("%s without a final report for the job within %v", m.leftWhy, m.cfg.StallTimeout)})
}

func (m *Machine) shutdown(at time.Time) {
	switch m.phase {
	case phaseFollowing:
		if m.graceAt.IsZero() {
			m.graceAt = at.Add(m.cfg.ShutdownGrace)
		}
	case phaseNew, phaseInquiring, phasePlacing:
		m.release()
	}
}

// cancelWorkers tells the workers still holding the job to drop it, except
// those named.
func (m *Machine) cancelWorkers(reason string, except ...string) {
	var ws []string
	for _, w := range []struct {
		id   string
		open bool
	}{{m.prefill, m.prefillOpen}, {m.head, m.decodeOpen}} {
		skip := w.id == "" || !w.open
		for _, x := range except {
			skip = skip || x == w.id
		}
		if !skip {
			ws = append(ws, w.id)
		}
	}
	if len(ws) > 0 {
		m.emit(CancelOn{Workers: ws, Reason: reason})
	}
	m.prefillOpen, m.decodeOpen = false, false
}

// advance moves the job on and announces it; a move the lifecycle forbids
// is skipped (and reported as a Bug action).
func (m *Machine) advance(at time.Time, s cp.JobState, u jobs.Update) {
	ev, err := m.job.Advance(s, at, u)
	if err != nil {
		m.emit(Bug{Err: err})
		return
	}
	m.emit(Publish{Event: ev})
}

func (m *Machine) fail(at time.Time, je *cp.JobError) {
	if je.Message == "" {
		je.Message = "failed"
	}
	m.end(at, cp.StateFailed, jobs.Update{Err: je})
}

// end moves the job to a final state, announces it and settles the
// delivery.
func (m *Machine) end(at time.Time, s cp.JobState, u jobs.Update) {
	ev, err := m.job.Advance(s, at, u)
	if err != nil {
		m.emit(Bug{Err: err})
		last := m.job.Last()
		ev = last
	} else {
		m.emit(Publish{Event: ev})
	}
	m.final = &ev
	m.phase = phaseEnded
	m.clearTimers()
	m.emit(Settle{Ack: true})
}

// release hands the job back to the queue without a final state.
func (m *Machine) release() {
	m.phase = phaseEnded
	m.clearTimers()
	m.emit(Settle{Ack: false})
}

func (m *Machine) clearTimers() {
	m.placeBy, m.retryAt, m.deadline, m.stallAt, m.graceAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
}
