package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/jobrun"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/tokenizer"
)

// message is what reaches a running job: a worker's progress, the loss of
// a worker, or a client's cancellation.
type message struct {
	progress *cp.Progress
	at       time.Time // when the coordinator received it

	lost, reason string
	left         bool      // the worker deregistered (a clean exit)
	since        time.Time // when the registry recorded the loss

	cancel string
	reply  chan *cp.CancelReply

	reconnected bool // the coordinator's connection came back
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
// workers holding the job (the job's machine).
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

// run is the I/O around one delivery of a job: the job's state machine
// (coordinator/jobrun) decides, the run carries out its actions and feeds
// it what happens.
type run struct {
	c     *Coordinator
	id    string
	req   *cp.SubmitRequest
	log   *zap.Logger
	inbox *mailbox
	m     *jobrun.Machine
	// client submitted the job: its events and tokens go to its namespace,
	// in encoding (QueuedJob.Encoding).
	client   string
	encoding string

	// changed is closed at the next registry change after the last
	// placement try.
	changed <-chan struct{}
	// cancelReply answers the client's cancellation being applied.
	cancelReply chan *cp.CancelReply
	settle      *jobrun.Settle
	// ended is closed when the run stops reading its inbox (the job
	// reached its end, or goes back to the queue).
	ended chan struct{}
}

// drive runs one delivery of a job and settles it: acknowledged at a final
// state, released when the coordinator stops first.
func (c *Coordinator) drive(ctx context.Context, d *cp.Delivery) {
	qj := d.Job
	r := &run{c: c, id: qj.JobID, req: &qj.Request, client: qj.Client, encoding: qj.Encoding, inbox: newMailbox(), ended: make(chan struct{}),
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
	c.table.Own(qj.JobID, qj.Client, qj.WireEncoding())
	cancelled, early := c.pendingCancel[qj.JobID]
	delete(c.pendingCancel, qj.JobID)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.runs, qj.JobID)
		c.mu.Unlock()
		c.load.forget(qj.JobID)
	}()
	r.log.Debug("job delivered", zap.Uint64("delivered", d.NumDelivered))

	dl := jobrun.Delivery{NumDelivered: d.NumDelivered, LastAttempt: d.LastAttempt()}
	if early {
		dl.Cancelled = cancelled
		if dl.Cancelled == "" {
			dl.Cancelled = "cancelled by a client"
		}
	}
	if req, err := c.admit(r.req); err != nil {
		dl.Refused = &cp.JobError{Code: codeOf(err), Message: err.Error()}
	} else {
		r.req = req
	}
	policy := r.req.Policy
	if policy == "" {
		policy = c.cfg.Policy
	}
	r.m = jobrun.New(jobrun.Config{Layers: c.cfg.Model.NumLayers, PlacementWait: c.cfg.PlacementWait,
		StallTimeout: c.cfg.StallTimeout, JobTimeout: c.cfg.JobTimeout, ShutdownGrace: c.cfg.ShutdownGrace},
		qj.JobID, qj.Submitted, len(r.req.TokenIDs), policy)
	stop := d.KeepAlive()
	r.loop(ctx, dl)
	stop()
	close(r.ended)
	if r.settle == nil || !r.settle.Ack {
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

// loop feeds the machine until the run ends.
func (r *run) loop(ctx context.Context, dl jobrun.Delivery) {
	r.exec(r.m.Step(jobrun.Start{At: time.Now(), Delivery: dl}))
	shutdown := ctx.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for !r.m.Ended() {
		timer.Stop()
		var tick <-chan time.Time
		if next := r.m.Next(); !next.IsZero() {
			timer.Reset(time.Until(next))
			tick = timer.C
		}
		select {
		case <-r.inbox.wake:
			for _, msg := range r.inbox.take() {
				if r.m.Ended() {
					// A cancellation that comes after the end is answered
					// from the job list, once r.ended is closed.
					continue
				}
				r.exec(r.m.Step(r.eventOf(msg)))
			}
		case <-r.changed:
			r.changed = nil
			r.exec(r.m.Step(jobrun.WorkersChanged{At: time.Now()}))
		case now := <-tick:
			r.exec(r.m.Step(jobrun.Tick{At: now}))
		case <-shutdown:
			shutdown = nil
			r.exec(r.m.Step(jobrun.Shutdown{At: time.Now()}))
		}
	}
}

// eventOf turns a message from the inbox into the machine's event.
func (r *run) eventOf(msg message) jobrun.Event {
	switch {
	case msg.reply != nil:
		r.cancelReply = msg.reply
		return jobrun.Cancel{At: time.Now(), Reason: msg.cancel}
	case msg.reconnected:
		return jobrun.Reconnected{At: time.Now()}
	case msg.lost != "":
		return jobrun.WorkerLost{At: time.Now(), Worker: msg.lost, Reason: msg.reason, Left: msg.left, Since: msg.since}
	default:
		if !r.m.Speaks(msg.progress.WorkerID) {
			// Only the workers holding the job speak for it.
			r.log.Warn("progress report ignored: the worker does not hold the job", zap.String("worker", msg.progress.WorkerID),
				zap.String("stage", string(msg.progress.Stage)))
		}
		return jobrun.Report{At: msg.at, P: msg.progress}
	}
}

// exec carries out the machine's actions, feeding back the results of
// those that have one.
func (r *run) exec(acts []jobrun.Action) {
	c := r.c
	for len(acts) > 0 {
		a := acts[0]
		acts = acts[1:]
		switch a := a.(type) {
		case jobrun.Publish:
			r.publish(a.Event)
		case jobrun.Inquire:
			acts = append(acts, r.m.Step(r.inquire())...)
		case jobrun.Check:
			acts = append(acts, r.m.Step(r.check(a.Worker))...)
		case jobrun.Place:
			acts = append(acts, r.m.Step(r.place(a.Exclude))...)
		case jobrun.Assign:
			acts = append(acts, r.m.Step(r.request(a.Worker, a.Assignment))...)
		case jobrun.CancelOn:
			var wg sync.WaitGroup
			for _, w := range a.Workers {
				wg.Add(1)
				go func() { defer wg.Done(); r.cancelOn(w, a.Reason) }()
			}
			wg.Wait()
		case jobrun.ReplyCancel:
			if r.cancelReply != nil {
				r.cancelReply <- &cp.CancelReply{JobID: r.id, State: a.State}
				r.cancelReply = nil
			}
		case jobrun.ObservePass:
			// The compute terms come fitted in the workers' heartbeats.
			c.est.ObserveFloor(a.Floor)
		case jobrun.ObserveTransfer:
			c.est.ObserveTransfer(a.BytesPerSec, time.Second)
		case jobrun.ObserveDecodeStep:
			c.est.ObserveDecodeStep(a.Step)
		case jobrun.ObserveLocalPrefill:
			// The decode group fits its own prefill terms (its heartbeat).
		case jobrun.LoadPrefill:
			c.load.addPrefill(a.Worker, r.id, a.Tokens)
		case jobrun.LoadLocal:
			c.load.addLocal(a.Group, r.id, a.Tokens)
		case jobrun.LoadProgress:
			c.load.prefillProgress(a.Worker, r.id, a.Done, a.Total)
		case jobrun.LoadForget:
			c.load.forget(r.id)
		case jobrun.AssignedAt:
			c.m.Assigned(a.Latency)
			if rd := r.m.Job().Route(); rd != nil {
				r.log.Info("job assigned", zap.String("target", string(rd.Target)), zap.String("group", rd.DecodeGroup),
					zap.String("prefill_worker", rd.PrefillWorker), zap.Duration("predicted_local", rd.PredictedLocal),
					zap.Duration("predicted_remote", rd.PredictedRemote), zap.Int("tokens", len(r.req.TokenIDs)), zap.String("reason", rd.Reason))
			}
		case jobrun.Settle:
			r.settle = &a
		case jobrun.Bug:
			r.log.Error("job lifecycle", zap.Error(a.Err))
		default:
			r.log.Error("job run: unknown action", zap.String("action", fmt.Sprintf("%T", a)))
		}
	}
}

// inquire asks every decode group's rank 0 and every prefill worker of
// the model what they know of the job (all at once, each bounded by the
// assignment timeout). A worker that does not answer knows nothing: if it
// holds the job after all, the assignment it gets is answered Resumed.
func (r *run) inquire() jobrun.Event {
	c := r.c
	workers, _ := c.view.snapshot()
	ranks := map[string][]string{}
	var asked []jobrun.WorkerReport
	for _, w := range workers {
		if !modelinfo.Match(c.cfg.Model.ID, w.Model) {
			continue
		}
		switch {
		case w.Kind == cp.KindPrefill:
			asked = append(asked, jobrun.WorkerReport{Worker: w.ID, Kind: w.Kind})
		case w.Kind == cp.KindDecode:
			ranks[w.GroupID] = append(ranks[w.GroupID], w.ID)
			if w.Rank == 0 {
				asked = append(asked, jobrun.WorkerReport{Worker: w.ID, Kind: w.Kind, Group: w.GroupID})
			}
		}
	}
	var wg sync.WaitGroup
	for i := range asked {
		asked[i].Ranks = ranks[asked[i].Group]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.AssignTimeout)
			defer cancel()
			rep, err := cp.JobStatus(ctx, c.nc, asked[i].Worker, r.id)
			if err != nil {
				r.log.Info("job status: no answer", zap.String("worker", asked[i].Worker), zap.Error(err))
				return
			}
			asked[i].Reply = rep
		}()
	}
	wg.Wait()
	for _, a := range asked {
		if a.Reply != nil && (a.Reply.Held || a.Reply.Finished()) {
			r.log.Info("job found on a worker", zap.String("worker", a.Worker), zap.Bool("running", a.Reply.Held),
				zap.String("stage", string(a.Reply.Progress.Stage)))
		}
	}
	return jobrun.Inquired{At: time.Now(), Reports: asked}
}

// check asks worker what it knows of the job, bounded by the assignment
// timeout.
func (r *run) check(worker string) jobrun.Event {
	ctx, cancel := context.WithTimeout(context.Background(), r.c.cfg.AssignTimeout)
	defer cancel()
	rep, err := cp.JobStatus(ctx, r.c.nc, worker, r.id)
	switch {
	case err != nil:
		r.log.Info("job status: no answer", zap.String("worker", worker), zap.Error(err))
	case rep.Progress != nil:
		r.log.Info("job status", zap.String("worker", worker), zap.Bool("held", rep.Held),
			zap.String("stage", string(rep.Progress.Stage)), zap.Int("tokens", rep.Progress.Tokens))
	default:
		r.log.Info("job status: the worker does not know the job", zap.String("worker", worker))
	}
	return jobrun.Checked{At: time.Now(), Reply: rep, Err: err}
}

// place looks for a decode group (and prefill worker) that can take the
// job, routes it and builds its assignments.
func (r *run) place(exclude []string) jobrun.Event {
	c, m := r.c, r.c.cfg.Model
	n := len(r.req.TokenIDs)
	need := n + r.req.MaxTokens
	policy := r.req.Policy
	if policy == "" {
		policy = c.cfg.Policy
	}
	workers, changed := c.view.snapshot()
	r.changed = changed
	gs, problems := groups(workers, m)
	g := pickGroup(gs, need, r.req.TokenIDs)
	var pf *cp.WorkerInfo
	for _, w := range prefillWorkers(workers, m) {
		if g != nil && w.Model != g.Ranks[0].Model {
			continue // the prefill worker's state must be the decode group's model's
		}
		if !slices.Contains(exclude, w.ID) || policy == cp.PolicyRemote {
			pf = &w
			break
		}
	}
	now := time.Now()
	switch {
	case g == nil && len(gs) == 0:
		why := fmt.Sprintf("no decode group of model %s is up", m.ID)
		if len(problems) > 0 {
			why += fmt.Sprintf(" (%v)", problems)
		}
		return jobrun.Candidate{At: now, Why: why}
	case g == nil:
		return jobrun.Candidate{At: now, Why: fmt.Sprintf("no decode group has room for %d tokens now", need)}
	case policy == cp.PolicyRemote && pf == nil && n > 1:
		return jobrun.Candidate{At: now, Why: fmt.Sprintf("policy remote: no prefill worker of model %s is up", m.ID)}
	}
	rd, _ := c.decide(policy, pf, g, r.req.TokenIDs, r.req.Images)
	remote := rd.Target == cp.TargetRemote
	if remote {
		if why := r.answers(pf.ID); why != "" {
			return jobrun.Candidate{At: time.Now(), Why: why, Unreachable: pf.ID}
		}
	}
	a := cp.Assignment{JobID: r.id, GroupID: g.ID, Client: r.client, Encoding: r.encoding, Sampling: r.req.Sampling}
	var session string
	var secret []byte
	if remote {
		// One session for every rank: kvtransfer sends a job's layers
		// under one id and secret, which only this job's workers get.
		session, secret = cp.NewSessionID(), cp.NewSecret()
		a.Deadline = now.Add(c.cfg.TransferTimeout)
	}
	for _, w := range g.Ranks {
		p := cp.LayerPlacement{Rank: w.Rank, WorkerID: w.ID, Layers: w.Layers, TensorRank: w.TensorRank, TensorRanks: w.TensorRanks,
			Transfer: w.Endpoints.Transfer, Pipeline: w.Endpoints.Pipeline}
		if remote {
			p.SessionID, p.Secret = session, secret
		}
		a.Placement = append(a.Placement, p)
	}
	head := g.Head().ID
	dec := a.ForWorker(head)
	plan := &jobrun.Plan{Route: rd, Group: g.ID, Head: head, Ranks: g.Workers(), Decode: &dec}
	if remote {
		// The prefill worker's part: the prompt but its last token, or up
		// to the prefix caches' grid (the group prefills the rest itself).
		R := n - 1
		h := g.Head()
		if split, _, appendTo := remoteCaches(pf, &h, r.req.TokenIDs); split > 0 && !c.padsFrom(r.req, split) {
			R = split
			dec.CachedTokenIDs, dec.AppendTokens = r.req.TokenIDs[:R], appendTo
			dec.Images = r.req.Images // the head keys its cache entry by them
		}
		dec.TokenIDs, dec.CachedTokens = r.req.TokenIDs[R:], R
		pre := a
		pre.Role, pre.WorkerID, pre.TokenIDs, pre.Images = cp.RolePrefill, pf.ID, r.req.TokenIDs[:R], r.req.Images
		plan.Prefill, plan.PrefillAssignment = pf.ID, &pre
	} else {
		dec.TokenIDs, dec.Images = r.req.TokenIDs, r.req.Images
	}
	return jobrun.Candidate{At: time.Now(), Plan: plan}
}

// padsFrom reports whether a job with images has image pad ids at or after
// position from of its prompt. A remote job's decode part must hold none:
// the images are computed where the prompt prefills, and a remote job's
// pad runs all go to the prefill worker (admission keeps the prompt's
// last token from being one).
func (c *Coordinator) padsFrom(req *cp.SubmitRequest, from int) bool {
	if len(req.Images) == 0 || c.cfg.Tokenizer == nil {
		return false
	}
	pad, ok := c.cfg.Tokenizer.SpecialID(tokenizer.MediaPad)
	return ok && slices.Contains(req.TokenIDs[from:], int32(pad))
}

// pickGroup chooses the decode group for a job of need tokens: one that
// can hold it, preferring room now, then the one holding the longest
// prefix of prompt in its prefix cache (a session's next turn goes where
// its history is), then the least loaded.
func pickGroup(gs []group, need int, prompt []int32) *group {
	best, bestCached := -1, 0
	for i := range gs {
		g := &gs[i]
		if g.Capacity < need {
			continue
		}
		h := g.Head()
		cached := cachedPrefix(&h, prompt)
		if best < 0 {
			best, bestCached = i, cached
			continue
		}
		b := &gs[best]
		better := false
		switch {
		case (g.Free >= need) != (b.Free >= need):
			better = g.Free >= need
		case cached != bestCached:
			better = cached > bestCached
		default:
			better = g.Active < b.Active
		}
		if better {
			best, bestCached = i, cached
		}
	}
	if best < 0 {
		return nil
	}
	return &gs[best]
}

// answers checks that a prefill worker is there before the decode group
// reserves anything for a remote job: a worker that died keeps its
// registration for up to the registry TTL, but no longer answers. It
// returns why not, or "".
func (r *run) answers(worker string) string {
	ctx, cancel := context.WithTimeout(context.Background(), r.c.cfg.AssignTimeout)
	defer cancel()
	_, err := cp.JobStatus(ctx, r.c.nc, worker, r.id)
	var re *cp.RemoteError
	if err == nil || errors.As(err, &re) {
		return ""
	}
	r.log.Info("prefill worker does not answer", zap.String("worker", worker), zap.Error(err))
	return fmt.Sprintf("prefill worker %s does not answer: %v", worker, err)
}

// request sends one assignment and returns the answer as the machine's
// event.
func (r *run) request(worker string, a *cp.Assignment) jobrun.Event {
	c := r.c
	if a.Role == "" {
		a.Role = cp.RoleDecode
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.AssignTimeout)
	defer cancel()
	// A worker that dies holding the request never answers it (rank 0 can
	// stream a job's first tokens before its answer goes out): its loss
	// ends the wait. A loss the registry recorded before the request went
	// out is a restart whose new process serves it, or a death the request
	// learns of by itself (no responders).
	sent := time.Now()
	var lost atomic.Pointer[string]
	stop := c.losses.watch(worker, func(reason string, since time.Time) {
		if !since.Before(sent) && lost.CompareAndSwap(nil, &reason) {
			cancel()
		}
	})
	var rep cp.AssignReply
	err := cp.Request(ctx, c.nc, cp.WorkerAssign(worker), a, &rep)
	stop()
	at := time.Now()
	switch reason := lost.Load(); {
	case err != nil && reason != nil:
		r.log.Info("assignment: worker lost before it answered", zap.String("worker", worker), zap.String("reason", *reason))
		return jobrun.Assigned{At: at, Lost: *reason}
	case errors.Is(err, nats.ErrNoResponders):
		r.log.Info("assignment: no worker", zap.String("worker", worker), zap.Error(err))
		return jobrun.Assigned{At: at, NoResponders: true}
	case err != nil:
		return jobrun.Assigned{At: at, Err: fmt.Errorf("within %v: %w", c.cfg.AssignTimeout, err)}
	}
	switch {
	case rep.Resumed:
		r.log.Info("assignment resumed a job the worker already has", zap.String("worker", worker))
	case !rep.Accepted:
		r.log.Info("assignment refused", zap.String("worker", worker), zap.String("code", string(rep.Code)), zap.String("reason", rep.Error))
	}
	return jobrun.Assigned{At: at, Reply: &rep}
}

// cancelOn asks one worker to drop the job.
func (r *run) cancelOn(worker, reason string) {
	if !r.c.nc.IsConnected() {
		// The request could only wait out its timeout (a coordinator
		// stopping after its NATS server went away did, past its
		// grace). The worker keeps the job; whoever takes the job over
		// finds it there (a job id is admitted once).
		r.log.Warn("cancel on worker skipped: not connected to NATS", zap.String("worker", worker),
			zap.String("nats", strings.ToLower(r.c.nc.Status().String())))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.c.cfg.AssignTimeout)
	defer cancel()
	rep, err := cancelRequest(ctx, r.c.nc, worker, r.id, reason)
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

// publish announces one of the job's events. A final event is stored in
// the results first, so that a client that asks after it was published
// finds it.
func (r *run) publish(ev cp.JobEvent) {
	c := r.c
	if ev.State.Final() && c.results != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.results.Put(ctx, r.client, &ev); err != nil {
			r.log.Warn("store the job's result", zap.Error(err))
		}
		cancel()
	}
	// Counted before it is announced: a client that saw its job end and
	// then scrapes /metrics finds the job there.
	defer c.publish(ev)
	switch {
	case ev.State == cp.StateRouted && ev.Route != nil:
		rd := ev.Route
		c.m.Route(string(rd.Policy), string(rd.Target), rd.PredictedLocal, rd.PredictedRemote)
	case ev.State.Final():
		t := ev.Timing
		if t == nil {
			t = &cp.Timing{}
		}
		target := ""
		if ev.Route != nil {
			target = string(ev.Route.Target)
		}
		pass := time.Duration(0)
		if target == string(cp.TargetRemote) {
			pass = t.Prefill
		}
		c.m.Finished(string(ev.State), target, t.FirstToken, pass, t.TransferTail, t.DecodeTokensPerSec)
		if rd := ev.Route; ev.State == cp.StateDone && rd != nil && rd.Parts != nil {
			// A remote job's group prefills the tokens after the split
			// (parts.Prefill) after the commit, before its first step.
			after := rd.Parts.FirstStep + rd.Parts.Prefill
			if d, ok := router.Overhead(router.Target(rd.Target), rd.Parts.QueueWait, after, t.FirstToken, t.Prefill, t.TransferTail, t.Prefill); ok {
				c.est.ObserveOverhead(router.Target(rd.Target), d)
			}
		}
		c.m.Tokens(target, t.PromptTokens, t.CachedTokens, t.OutputTokens, t.Decode)
		fields := []zap.Field{zap.String("state", string(ev.State)), zap.String("target", target), zap.Duration("ttft", t.FirstToken),
			zap.Duration("total", t.Total), zap.Int("prompt_tokens", t.PromptTokens), zap.Int("output_tokens", t.OutputTokens)}
		if ev.Error != nil {
			fields = append(fields, zap.String("error", ev.Error.Error()))
		}
		if ev.State == cp.StateFailed {
			r.log.Warn("job ended", fields...)
		} else {
			r.log.Info("job ended", fields...)
		}
	}
}

func cancelRequest(ctx context.Context, nc *nats.Conn, worker, job, reason string) (*cp.CancelReply, error) {
	var rep cp.CancelReply
	if err := cp.Request(ctx, nc, cp.WorkerCancel(worker), &cp.CancelRequest{JobID: job, Reason: reason}, &rep); err != nil {
		return nil, err
	}
	return &rep, rep.Err()
}
