package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/jobs"
)

// message is what reaches a running job: a worker's progress, the loss of
// a worker, or a client's cancellation.
type message struct {
	progress *cp.Progress
	at       time.Time // when the coordinator received it

	lost, reason string
	since        time.Time // when the registry recorded the loss

	cancel string
	reply  chan *cp.CancelReply
}

// mailbox queues messages for a run without ever blocking the sender (the
// NATS callbacks and the registry watch).
type mailbox struct {
	mu    sync.Mutex
	items []message
	wake  chan struct{}
}

func newMailbox() *mailbox { return &mailbox{wake: make(chan struct{}, 1)} }

func (m *mailbox) put(x message) {
	m.mu.Lock()
	m.items = append(m.items, x)
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

func (m *mailbox) take() []message {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.items
	m.items = nil
	return out
}

// onProgress hands a worker's report to its job's run. Only workers may
// publish progress (the NATS server's permissions), each under its own
// worker subject when its identity is named; the report must say the
// worker and job its subject does, and the run takes it only from the
// workers holding the job (handle).
func (c *Coordinator) onProgress(msg *nats.Msg) {
	at := time.Now()
	var p cp.Progress
	if _, err := cp.DecodeMsg(msg, &p); err != nil {
		c.log.Warn("undecodable progress report", zap.String("subject", msg.Subject), zap.Error(err))
		return
	}
	if worker, job, err := cp.ProgressSender(msg.Subject); err != nil || worker != p.WorkerID || job != p.JobID {
		c.log.Warn("progress report ignored: its subject names another worker or job", zap.String("subject", msg.Subject),
			zap.String("worker", p.WorkerID), zap.String("job", p.JobID))
		return
	}
	c.mu.Lock()
	r := c.runs[p.JobID]
	c.mu.Unlock()
	if r != nil {
		r.inbox.put(message{progress: &p, at: at})
	}
}

// run drives one delivered job to a final state.
type run struct {
	c     *Coordinator
	job   *jobs.Job
	req   *cp.SubmitRequest
	log   *zap.Logger
	inbox *mailbox
	// client submitted the job: its events and tokens go to its namespace.
	client string

	group   *group
	head    string // the group's rank 0
	prefill string // the prefill worker of a remote job
	// involved: the workers holding the job, with when their assignment
	// was sent (the whole group's ranks count from rank 0's).
	involved map[string]time.Time
	// prefillOpen and decodeOpen: that side was assigned and has not
	// reported its end.
	prefillOpen, decodeOpen bool
	cancelling              bool
	// refused says why the last try to assign the job did not take.
	refused string
	// ended is closed when the run stops reading its inbox (the job
	// reached its end, or goes back to the queue).
	ended chan struct{}
}

// drive runs one delivery of a job and settles it: acknowledged at a final
// state, released when the coordinator stops first.
func (c *Coordinator) drive(ctx context.Context, d *cp.Delivery) {
	qj := d.Job
	r := &run{c: c, req: &qj.Request, client: qj.Client, inbox: newMailbox(), involved: map[string]time.Time{}, ended: make(chan struct{}),
		log: c.log.With(zap.String("job", qj.JobID))}
	c.mu.Lock()
	if c.runs[qj.JobID] != nil {
		c.mu.Unlock()
		// The queue sent the job again while this coordinator runs it
		// (its in-progress signals were late): the run in hand settles it.
		r.log.Warn("job delivered again while running here; ignoring the new delivery", zap.Uint64("delivered", d.NumDelivered))
		return
	}
	c.runs[qj.JobID] = r
	c.table.Own(qj.JobID, qj.Client)
	cancelled, early := c.pendingCancel[qj.JobID]
	delete(c.pendingCancel, qj.JobID)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.runs, qj.JobID)
		c.mu.Unlock()
		c.load.forget(qj.JobID)
	}()

	r.job = jobs.New(qj.JobID, qj.Submitted, len(qj.Request.TokenIDs))
	r.job.Queued("") // announced at submission
	r.log.Debug("job delivered", zap.Uint64("delivered", d.NumDelivered))
	var final *cp.JobEvent
	switch {
	case early:
		final = r.end(cp.StateCancelled, jobs.Update{Detail: "cancelled while queued", Err: &cp.JobError{Message: cancelled}})
	case d.LastAttempt() && d.Redelivered():
		final = r.fail(&cp.JobError{Code: cp.CodeInternal, Message: fmt.Sprintf(
			"delivered %d times without reaching a final state (its coordinators stopped while running it); given up", d.NumDelivered)})
	default:
		stop := d.KeepAlive()
		final = r.execute(ctx)
		stop()
	}
	close(r.ended)
	if final == nil {
		if err := d.Release(0); err != nil {
			r.log.Warn("release job", zap.Error(err))
		} else {
			r.log.Info("job handed back to the queue")
		}
		return
	}
	actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Ack(actx); err != nil {
		r.log.Error("acknowledge finished job", zap.Error(err))
	}
}

// execute places, routes and assigns the job, then follows it. It returns
// the final event, or nil when the coordinator stopped and the job goes
// back to the queue.
func (r *run) execute(ctx context.Context) *cp.JobEvent {
	c := r.c
	req, err := c.admit(r.req)
	if err != nil {
		// Stored by a coordinator with other limits, or another model.
		return r.fail(&cp.JobError{Code: codeOf(err), Message: err.Error()})
	}
	r.req = req
	r.job.PromptTokens = len(req.TokenIDs)
	if ev := r.place(ctx); ev != nil || r.group == nil {
		return ev
	}
	return r.follow(ctx)
}

// place waits for a decode group (and prefill worker) that can take the
// job, routes it and assigns it. It returns a final event when the job
// ended instead, and nil with r.group set once assigned (nil with no group:
// the coordinator stops).
func (r *run) place(ctx context.Context) *cp.JobEvent {
	c, m := r.c, r.c.cfg.Model
	n := len(r.req.TokenIDs)
	need := n + r.req.MaxTokens
	policy := r.req.Policy
	if policy == "" {
		policy = c.cfg.Policy
	}
	giveUp := time.NewTimer(c.cfg.PlacementWait)
	defer giveUp.Stop()
	// Prefill workers that turned this job down; under policy auto it then
	// goes local rather than wait for them.
	exclude := map[string]bool{}
	for {
		workers, changed := c.view.snapshot()
		gs, problems := groups(workers, m)
		g := pickGroup(gs, need)
		var pf *cp.WorkerInfo
		for _, w := range prefillWorkers(workers, m) {
			if !exclude[w.ID] || policy == cp.PolicyRemote {
				pf = &w
				break
			}
		}
		var why string
		switch {
		case g == nil && len(gs) == 0:
			why = fmt.Sprintf("no decode group of model %s is up", m.ID)
			if len(problems) > 0 {
				why += fmt.Sprintf(" (%v)", problems)
			}
		case g == nil:
			why = fmt.Sprintf("no decode group has room for %d tokens now", need)
		case policy == cp.PolicyRemote && pf == nil && n > 1:
			why = fmt.Sprintf("policy remote: no prefill worker of model %s is up", m.ID)
		}
		retry := time.Duration(0)
		if why == "" {
			ev, again := r.assign(policy, g, pf, exclude)
			if ev != nil || !again {
				return ev
			}
			why, retry = r.refused, 250*time.Millisecond
		}
		retryT := time.NewTimer(retry)
		if retry == 0 {
			retryT.Stop()
		}
		select {
		case <-changed:
		case <-retryT.C:
		case <-r.inbox.wake:
			for _, msg := range r.inbox.take() {
				if msg.reply != nil {
					ev := r.end(cp.StateCancelled, jobs.Update{Detail: "cancelled before it was assigned", Err: &cp.JobError{Message: msg.cancel}})
					msg.reply <- &cp.CancelReply{JobID: r.job.ID, State: cp.StateCancelled}
					return ev
				}
			}
		case <-giveUp.C:
			return r.fail(&cp.JobError{Code: cp.CodeUnavailable, Message: fmt.Sprintf("not placed within %v: %s", c.cfg.PlacementWait, why)})
		case <-ctx.Done():
			return nil
		}
		retryT.Stop()
	}
}

// pickGroup chooses the decode group for a job of need tokens: one that
// can hold it, preferring room now, then the least loaded.
func pickGroup(gs []group, need int) *group {
	var best *group
	better := func(a, b *group) bool {
		if (a.Free >= need) != (b.Free >= need) {
			return a.Free >= need
		}
		return a.Active < b.Active
	}
	for i := range gs {
		g := &gs[i]
		if g.Capacity < need {
			continue
		}
		if best == nil || better(g, best) {
			best = g
		}
	}
	return best
}

// assign routes the job between pf (nil: none) and g and hands it out: the
// decode group first (it reserves the memory and expects the transfer),
// then the prefill worker. It returns a final event if the job failed, or
// again=true when the workers turned it down for now (no memory, not
// ready, shutting down, gone). A job is tried again only while no worker
// holds it: once the decode group admitted it, a failure to hand it to the
// prefill worker fails the job, since a second admission under the same
// job id could mix its messages with those of the first.
func (r *run) assign(policy cp.Policy, g *group, pf *cp.WorkerInfo, exclude map[string]bool) (ev *cp.JobEvent, again bool) {
	c := r.c
	n := len(r.req.TokenIDs)
	decidedAt := time.Now()
	rd, d := c.decide(policy, pf, g, n)
	remote := rd.Target == cp.TargetRemote

	a := cp.Assignment{JobID: r.job.ID, GroupID: g.ID, Client: r.client, Sampling: r.req.Sampling}
	var session string
	var secret []byte
	if remote {
		// One session for every rank: kvtransfer sends a job's layers
		// under one id and secret, which only this job's workers get.
		session, secret = cp.NewSessionID(), cp.NewSecret()
		a.Deadline = decidedAt.Add(c.cfg.TransferTimeout)
	}
	for _, w := range g.Ranks {
		p := cp.LayerPlacement{Rank: w.Rank, WorkerID: w.ID, Layers: w.Layers, Transfer: w.Endpoints.Transfer, Pipeline: w.Endpoints.Pipeline}
		if remote {
			p.SessionID, p.Secret = session, secret
		}
		a.Placement = append(a.Placement, p)
	}
	head := g.Head().ID
	if remote && !r.answers(pf.ID) {
		exclude[pf.ID] = true // under policy auto, the next try goes local
		return nil, true
	}
	// Announced before the assignments go out: the routed event marks the
	// end of the control plane's own work on the job.
	c.m.Route(string(policy), string(rd.Target), d.Local.Total, d.Remote.Total)
	r.advance(cp.StateRouted, decidedAt, jobs.Update{Route: rd, Detail: rd.Reason})
	dec := a.ForWorker(head)
	if remote {
		dec.TokenIDs, dec.CachedTokens = r.req.TokenIDs[n-1:], n-1
	} else {
		dec.TokenIDs = r.req.TokenIDs
	}
	// A local prefill starts as the group admits the job, before its
	// answer is back; a remote one as the prefill worker takes it.
	started := time.Now()
	sentDecode := started
	if ev, again := r.request(head, &dec); ev != nil || again {
		return ev, again
	}
	if remote {
		pre := a
		pre.Role, pre.WorkerID, pre.TokenIDs = cp.RolePrefill, pf.ID, r.req.TokenIDs[:n-1]
		started = time.Now()
		ev, again := r.request(pf.ID, &pre)
		if again {
			ev = r.fail(&cp.JobError{Code: cp.CodeUnavailable, Worker: pf.ID,
				Message: "did not take the job after the decode group had admitted it"})
		}
		if ev != nil {
			r.cancelOn(head, "the prefill worker did not take the job")
			return ev, false
		}
	}
	// Assigned.
	assigned := time.Now()
	r.group, r.head, r.decodeOpen = g, head, true
	for _, id := range g.Workers() {
		r.involved[id] = sentDecode
	}
	if remote {
		r.prefill, r.prefillOpen = pf.ID, true
		r.involved[pf.ID] = started
		c.load.addPrefill(pf.ID, r.job.ID, n-1)
	} else {
		c.load.addLocal(g.ID, r.job.ID, n)
	}
	c.m.Assigned(assigned.Sub(r.job.Submitted))
	u := jobs.Update{Detail: fmt.Sprintf("decode group %s prefills %d tokens", g.ID, n)}
	if remote {
		u = jobs.Update{Detail: fmt.Sprintf("prefill worker %s prefills %d tokens", pf.ID, n-1),
			Progress: &cp.LayerProgress{Done: 0, Total: c.cfg.Model.NumLayers}}
	}
	r.advance(cp.StatePrefilling, started, u)
	r.log.Info("job assigned", zap.String("target", string(rd.Target)), zap.String("group", g.ID),
		zap.String("prefill_worker", rd.PrefillWorker), zap.Duration("predicted_local", rd.PredictedLocal),
		zap.Duration("predicted_remote", rd.PredictedRemote), zap.Int("tokens", n), zap.String("reason", rd.Reason))
	return nil, false
}

// answers checks that a prefill worker is there before the decode group
// reserves anything for a remote job: a worker that died keeps its
// registration for up to the registry TTL, but no longer answers (asked to
// cancel this job, which it does not hold, it says so).
func (r *run) answers(worker string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), r.c.cfg.AssignTimeout)
	defer cancel()
	_, err := cancelRequest(ctx, r.c.nc, worker, r.job.ID, "probe: are you there?")
	var re *cp.RemoteError
	if err == nil || errors.As(err, &re) {
		return true
	}
	r.log.Info("prefill worker does not answer", zap.String("worker", worker), zap.Error(err))
	r.refused = fmt.Sprintf("prefill worker %s does not answer: %v", worker, err)
	return false
}

// request sends one assignment and sorts out the answer.
func (r *run) request(worker string, a *cp.Assignment) (ev *cp.JobEvent, again bool) {
	c := r.c
	if a.Role == "" {
		a.Role = cp.RoleDecode
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.AssignTimeout)
	defer cancel()
	var rep cp.AssignReply
	if err := cp.Request(ctx, c.nc, cp.WorkerAssign(worker), a, &rep); err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			// Nobody took the request: the worker is gone (the registry
			// will say so) or not serving yet.
			r.log.Info("assignment: no worker", zap.String("worker", worker), zap.Error(err))
			r.refused = fmt.Sprintf("worker %s does not serve assignments (gone, or not started yet)", worker)
			return nil, true
		}
		// It may have been taken after all: make sure it is not kept (a
		// worker drops a job cancelled while it is being admitted).
		r.cancelOn(worker, "the assignment was not answered in time")
		return r.fail(&cp.JobError{Code: cp.CodeUnavailable, Worker: worker,
			Message: fmt.Sprintf("did not answer the assignment within %v: %v", c.cfg.AssignTimeout, err)}), false
	}
	if rep.Accepted {
		return nil, false
	}
	r.log.Info("assignment refused", zap.String("worker", worker), zap.String("code", string(rep.Code)), zap.String("reason", rep.Error))
	if rep.Code == cp.CodeUnavailable || rep.Code == cp.CodeConflict {
		r.refused = fmt.Sprintf("worker %s: %s", worker, rep.Error)
		return nil, true
	}
	return r.fail(&cp.JobError{Code: rep.Code, Worker: worker, Message: "refused the assignment: " + rep.Error}), false
}

// follow tracks the assigned job to its end.
func (r *run) follow(ctx context.Context) *cp.JobEvent {
	c := r.c
	deadline := time.NewTimer(time.Until(r.job.Submitted.Add(c.cfg.JobTimeout)))
	defer deadline.Stop()
	stall := time.NewTimer(time.Hour)
	stall.Stop()
	defer stall.Stop()
	shutdown := ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case <-r.inbox.wake:
			for _, msg := range r.inbox.take() {
				if ev := r.handle(msg, stall); ev != nil {
					return ev
				}
			}
		case <-stall.C:
			r.cancelWorkers("the decode group went silent")
			return r.fail(&cp.JobError{Code: cp.CodeUnavailable, Worker: r.head,
				Message: fmt.Sprintf("no report from the decode group for %v while decoding", c.cfg.StallTimeout)})
		case <-deadline.C:
			r.cancelWorkers("job timeout")
			return r.fail(&cp.JobError{Code: cp.CodeUnavailable, Message: fmt.Sprintf("the job did not finish within %v of its submission (job timeout)", c.cfg.JobTimeout)})
		case <-shutdown:
			shutdown, grace = nil, time.After(c.cfg.ShutdownGrace)
		case <-grace:
			r.cancelWorkers("the coordinator stopped; the job goes back to the queue")
			return nil
		}
	}
}

// handle applies one message; it returns the final event when the job ends.
func (r *run) handle(msg message, stall *time.Timer) *cp.JobEvent {
	switch {
	case msg.reply != nil:
		r.cancelWorkers(msg.cancel)
		ev := r.end(cp.StateCancelled, jobs.Update{Err: &cp.JobError{Message: msg.cancel}})
		msg.reply <- &cp.CancelReply{JobID: r.job.ID, State: cp.StateCancelled}
		return ev
	case msg.lost != "":
		sent, ok := r.involved[msg.lost]
		if !ok || sent.After(msg.since) {
			// Not ours, or a worker that restarted before the job was sent
			// to it (workers register before they serve): it holds the job.
			return nil
		}
		r.cancelWorkers(fmt.Sprintf("worker %s was lost", msg.lost), msg.lost)
		return r.fail(&cp.JobError{Code: cp.CodeUnavailable, Worker: msg.lost, Message: msg.reason})
	case msg.progress != nil:
		p := msg.progress
		switch p.WorkerID {
		case r.prefill:
			if r.prefillOpen {
				return r.onPrefill(p, msg.at)
			}
		case r.head:
			if r.decodeOpen {
				return r.onDecode(p, msg.at, stall)
			}
		default:
			// Only the workers holding the job speak for it.
			r.log.Warn("progress report ignored: the worker does not hold the job", zap.String("worker", p.WorkerID),
				zap.String("stage", string(p.Stage)))
		}
	}
	return nil
}

// onPrefill applies a report of the prefill worker.
func (r *run) onPrefill(p *cp.Progress, at time.Time) *cp.JobEvent {
	c, mk := r.c, &r.job.Marks
	passStart := at.Add(-p.Elapsed)
	if mk.PassStarted.IsZero() && p.Elapsed > 0 {
		mk.PassStarted = passStart
	}
	switch p.Stage {
	case cp.StatePrefilling:
		if p.Layers != nil {
			c.load.prefillProgress(r.prefill, r.job.ID, p.Layers.Done, p.Layers.Total)
		}
		if r.job.State() == cp.StatePrefilling {
			r.advance(cp.StatePrefilling, at, jobs.Update{Progress: p.Layers,
				Detail: fmt.Sprintf("%d of %d prompt tokens prefilled", p.Tokens, len(r.req.TokenIDs)-1)})
		}
	case cp.StateTransferring:
		mk.PrefillDone = at
		c.load.forget(r.job.ID) // off the prefill worker's queue
		if r.job.State() == cp.StatePrefilling {
			r.advance(cp.StateTransferring, at, jobs.Update{Progress: p.Layers,
				Detail: "prefill done; the last layers' state is in transfer"})
		}
	case cp.StateDone:
		r.prefillOpen = false
		if mk.PrefillDone.IsZero() {
			mk.PrefillDone = at
		}
		if mk.Committed.IsZero() || at.Before(mk.Committed) {
			mk.Committed = at
		}
		if mr := p.Measured; mr != nil {
			if mr.PrefillTokensPerSec > 0 && p.Tokens > 0 {
				compute := time.Duration(float64(p.Tokens) / mr.PrefillTokensPerSec * float64(time.Second))
				c.est.ObservePass(mr.PassFloor, compute, p.Tokens)
			}
			if mr.LinkBytesPerSec > 0 {
				c.est.ObserveTransfer(int64(mr.LinkBytesPerSec), time.Second)
			}
		}
	case cp.StateFailed, cp.StateCancelled:
		r.prefillOpen = false
		r.cancelWorkers("the prefill side ended")
		return r.fail(sideError(p, "cancelled the job"))
	}
	return nil
}

// onDecode applies a report of the decode group's head.
func (r *run) onDecode(p *cp.Progress, at time.Time, stall *time.Timer) *cp.JobEvent {
	c, mk := r.c, &r.job.Marks
	switch p.Stage {
	case cp.StateDecoding:
		stall.Reset(c.cfg.StallTimeout)
		if mk.FirstToken.IsZero() {
			mk.FirstToken = at
			c.load.forget(r.job.ID)
			if r.prefill != "" && mk.Committed.IsZero() {
				mk.Committed = at // at the latest; the prefill worker's report may still come
			}
			r.advance(cp.StateDecoding, at, jobs.Update{Detail: "first token"})
		}
	case cp.StateDone:
		r.decodeOpen = false
		mk.LastToken, mk.OutputTokens, mk.Decode = at, p.Tokens, p.Elapsed
		if mr := p.Measured; mr != nil {
			if mr.DecodeTokensPerSec > 0 {
				c.est.ObserveDecodeStep(time.Duration(float64(time.Second) / mr.DecodeTokensPerSec))
			}
			if mr.PrefillTokensPerSec > 0 && r.prefill == "" {
				n := len(r.req.TokenIDs)
				c.est.ObserveLocalPrefill(n, time.Duration(float64(n)/mr.PrefillTokensPerSec*float64(time.Second)))
			}
		}
		if r.prefillOpen {
			// Decoding needs the committed state: the prefill side is done.
			r.prefillOpen = false
		}
		return r.end(cp.StateDone, jobs.Update{Detail: fmt.Sprintf("%d tokens", p.Tokens)})
	case cp.StateFailed, cp.StateCancelled:
		r.decodeOpen = false
		mk.OutputTokens = p.Tokens
		r.cancelWorkers("the decode side ended")
		return r.fail(sideError(p, "ended the job"))
	}
	return nil
}

// sideError is the job's error when a worker ends its side of the job:
// the worker's own error, or, when it has none or cancelled, one saying
// that it did (what, in verb), naming the worker.
func sideError(p *cp.Progress, verb string) *cp.JobError {
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

// cancelWorkers tells the workers still holding the job to drop it (all
// at once, each bounded by the assignment timeout), except those named.
func (r *run) cancelWorkers(reason string, except ...string) {
	r.cancelling = true
	var wg sync.WaitGroup
	for _, w := range []struct {
		id   string
		open bool
	}{{r.prefill, r.prefillOpen}, {r.head, r.decodeOpen}} {
		if w.id == "" || !w.open || slices.Contains(except, w.id) {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); r.cancelOn(w.id, reason) }()
	}
	wg.Wait()
	r.prefillOpen, r.decodeOpen = false, false
}

// cancelOn asks one worker to drop the job.
func (r *run) cancelOn(worker, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.c.cfg.AssignTimeout)
	defer cancel()
	rep, err := cancelRequest(ctx, r.c.nc, worker, r.job.ID, reason)
	var re *cp.RemoteError
	switch {
	case errors.As(err, &re) && re.Code == cp.CodeNotFound:
		// It had finished or never took it: nothing held.
	case err != nil:
		r.log.Warn("cancel on worker", zap.String("worker", worker), zap.Error(err))
	default:
		r.log.Info("cancelled on worker", zap.String("worker", worker), zap.Uint64("freed_bytes", rep.FreedBytes))
	}
}

func cancelRequest(ctx context.Context, nc *nats.Conn, worker, job, reason string) (*cp.CancelReply, error) {
	var rep cp.CancelReply
	if err := cp.Request(ctx, nc, cp.WorkerCancel(worker), &cp.CancelRequest{JobID: job, Reason: reason}, &rep); err != nil {
		return nil, err
	}
	return &rep, rep.Err()
}

// advance moves the job on and announces it; a move the lifecycle forbids
// is a coordinator bug, logged and skipped.
func (r *run) advance(s cp.JobState, at time.Time, u jobs.Update) *cp.JobEvent {
	ev, err := r.job.Advance(s, at, u)
	if err != nil {
		r.log.Error("job lifecycle", zap.Error(err))
		return nil
	}
	r.c.publish(ev)
	return &ev
}

// fail ends the job as failed.
func (r *run) fail(je *cp.JobError) *cp.JobEvent {
	if je.Message == "" {
		je.Message = "failed"
	}
	return r.end(cp.StateFailed, jobs.Update{Err: je})
}

// end moves the job to a final state and records it.
func (r *run) end(s cp.JobState, u jobs.Update) *cp.JobEvent {
	now := time.Now()
	ev, err := r.job.Advance(s, now, u)
	if err != nil {
		// Only a job already final gets here; it has its event.
		r.log.Error("job lifecycle", zap.Error(err))
		last := r.job.Last()
		return &last
	}
	r.c.publish(ev)
	t := ev.Timing
	target := ""
	if ev.Route != nil {
		target = string(ev.Route.Target)
	}
	pass := time.Duration(0)
	if target == string(cp.TargetRemote) {
		pass = t.Prefill
	}
	r.c.m.Finished(string(s), target, t.FirstToken, pass, t.TransferTail, t.DecodeTokensPerSec)
	fields := []zap.Field{zap.String("state", string(s)), zap.String("target", target), zap.Duration("ttft", t.FirstToken),
		zap.Duration("total", t.Total), zap.Int("prompt_tokens", t.PromptTokens), zap.Int("output_tokens", t.OutputTokens)}
	if ev.Error != nil {
		fields = append(fields, zap.String("error", ev.Error.Error()))
	}
	if s == cp.StateFailed {
		r.log.Warn("job ended", fields...)
	} else {
		r.log.Info("job ended", fields...)
	}
	return &ev
}
