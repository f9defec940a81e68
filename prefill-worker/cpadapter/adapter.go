// Package cpadapter is the prefill worker's control-plane mode: it keeps
// the worker registered in the worker registry (heartbeats with its queue
// and measured rates), takes the coordinator's assignments (prefill
// prompt[:-1] and stream each layer's state to the decode ranks over
// kvtransfer, under the job's transfer session), takes cancellations, and
// reports each job's progress on NATS.
package cpadapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// Config configures the adapter.
type Config struct {
	Conn     *nats.Conn
	Registry *cp.Registry
	WorkerID string
	Worker   *worker.Worker
	// ModelID is the model's identity, modelinfo.Identity of the model
	// directory; the coordinator pairs workers of the same model.
	ModelID string
	Backend string // default "cpu"
	Version string
	// MemoryTotal is the worker's memory budget, reported in heartbeats.
	MemoryTotal int64
	// Heartbeat is the interval between heartbeats, by default a third of
	// the registry's TTL.
	Heartbeat time.Duration
	// Transfer and TransferConns configure the kvtransfer senders'
	// timeouts and connections per decode rank; zero takes kvtransfer's
	// defaults.
	Transfer      kvtransfer.Timeouts
	TransferConns int
	// DefaultDeadline bounds a job whose assignment has none; default 30 min.
	DefaultDeadline time.Duration
	// ProgressEvery is the least time between two progress reports of a
	// job, by default 100 ms; the last layer is always reported.
	ProgressEvery time.Duration
	// Remember is how long a finished job's final report is kept, by
	// default 1 h and for at most 4096 jobs, so that a coordinator taking the job over
	// after a crash learns how it ended instead of running it again.
	Remember time.Duration
	// Metrics records assignments and transfers, if set; MetricsAddr
	// is the host:port of the worker's /metrics, advertised in heartbeats.
	Metrics     *Metrics
	MetricsAddr string
	Log         *zap.Logger
}

// Adapter is the running control-plane mode of a prefill worker.
type Adapter struct {
	cfg     Config
	started time.Time
	log     *zap.Logger
	hb      *cp.Heartbeat
	cancel  context.CancelFunc

	life *cp.Lifecycle // taking jobs, draining or closing; the jobs taken

	mu    sync.Mutex
	jobs  map[string]*job
	ended *cp.Ended
}

// job is one assignment in progress.
type job struct {
	id        string
	sender    *kvtransfer.Sender
	handle    *worker.Job
	tokens    int
	assigned  time.Time
	cancelled string // reason, once the coordinator cancelled it

	mu        sync.Mutex
	lastSent  time.Time
	layer     int // layers done in the current pass
	layers    int
	computed  time.Time // the last layer of the last pass is done
	bytesThen int64     // bytes sent by then
}

// Start registers the worker and serves assignments until Close.
func Start(ctx context.Context, cfg Config) (*Adapter, error) {
	if cfg.Conn == nil || cfg.Registry == nil || cfg.Worker == nil {
		return nil, errors.New("prefill adapter: a NATS connection, a registry and a worker are required")
	}
	if err := cp.CheckID(cfg.WorkerID); err != nil {
		return nil, fmt.Errorf("prefill adapter: worker id: %w", err)
	}
	if cfg.Backend == "" {
		cfg.Backend = "cpu"
	}
	if cfg.DefaultDeadline <= 0 {
		cfg.DefaultDeadline = 30 * time.Minute
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 100 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	a := &Adapter{cfg: cfg, started: time.Now(), jobs: map[string]*job{}, ended: cp.NewEnded(0, cfg.Remember),
		log: cfg.Log.With(zap.String("worker", cfg.WorkerID))}
	a.life = cp.NewLifecycle(cfg.WorkerID, "prefill worker", a.running, a.log)
	// Serving before registering: a coordinator that finds the worker in
	// the registry finds it serving (an assignment sent to a worker that
	// did not serve yet failed its job). Assignments are refused until the
	// registry shows the worker (the coordinator tells a restarted worker's
	// old jobs from its new ones by that order).
	serveCtx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	queue := "tandem-worker-" + cfg.WorkerID
	// A failed subscription fails New; the others end with serveCtx.
	_, errAssign := cp.Serve(serveCtx, cfg.Conn, cp.WorkerAssign(cfg.WorkerID), queue, a.assign)
	_, errCancel := cp.Serve(serveCtx, cfg.Conn, cp.WorkerCancel(cfg.WorkerID), queue, a.cancelJob)
	_, errStatus := cp.Serve(serveCtx, cfg.Conn, cp.WorkerStatus(cfg.WorkerID), queue, a.status)
	_, errDrain := cp.Serve(serveCtx, cfg.Conn, cp.WorkerDrain(cfg.WorkerID), queue, a.life.DrainRequest)
	_, errCache := cp.Serve(serveCtx, cfg.Conn, cp.WorkerCache(cfg.WorkerID), queue, a.cacheRequest)
	if err := errors.Join(errAssign, errCancel, errStatus, errDrain, errCache, cp.Flushed(cfg.Conn)); err != nil {
		cancel()
		return nil, fmt.Errorf("prefill adapter: %w", err)
	}
	hb, err := cp.StartHeartbeat(ctx, cfg.Registry, cfg.Heartbeat, a.info, a.log)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("prefill adapter: %w", err)
	}
	a.hb = hb
	a.life.Registered(hb.Beat)
	a.log.Info("prefill worker registered", zap.String("model", cfg.ModelID))
	return a, nil
}

// Drain stops taking jobs and waits until the jobs running here end, or
// ctx ends; Close then cancels whatever is left. The registry shows the
// worker draining at once, and assignments that still come are refused
// unavailable, so that coordinators place their jobs elsewhere.
func (a *Adapter) Drain(ctx context.Context) error {
	a.life.StartDrain("")
	if err := a.life.Wait(ctx); err != nil {
		return fmt.Errorf("prefill adapter: drain: %d jobs still running: %w", a.running(), err)
	}
	return nil
}

// Draining is closed once a drain has started by Drain or a coordinator's
// DrainRequest; the process should then drain and exit.
func (a *Adapter) Draining() <-chan struct{} { return a.life.Draining() }

// NotReady says why the worker takes no jobs now, or is nil when it takes
// them.
func (a *Adapter) NotReady() error { return a.life.NotReady() }

// running is the number of jobs the worker holds.
func (a *Adapter) running() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.jobs)
}

// Close stops taking assignments, cancels the jobs in progress, whose
// coordinators learn it from their progress, and deregisters the worker.
// The worker itself is the caller's to close.
func (a *Adapter) Close(ctx context.Context) error {
	a.life.Close()
	a.mu.Lock()
	for id := range a.jobs {
		a.cfg.Worker.Cancel(id)
	}
	n := len(a.jobs)
	a.mu.Unlock()
	a.cancel()
	var errs []error
	if err := a.life.Wait(ctx); err != nil {
		errs = append(errs, fmt.Errorf("prefill adapter: %d jobs still ending: %w", n, err))
	}
	errs = append(errs, a.hb.Stop(ctx))
	return errors.Join(errs...)
}

func (a *Adapter) info() cp.WorkerInfo {
	st := a.cfg.Worker.Stats()
	w := cp.WorkerInfo{ID: a.cfg.WorkerID, Kind: cp.KindPrefill, Backend: a.cfg.Backend, Model: a.cfg.ModelID,
		Version: a.cfg.Version, QueueDepth: st.Queued, Active: st.InProgress, Endpoints: cp.Endpoints{Metrics: a.cfg.MetricsAddr},
		Rates: cp.Rates{PrefillTokensPerSec: st.PrefillTokensPerSec, PassFloor: st.PassFloor, ReadBytesPerSec: st.ReadBytesPerSec,
			Compute: cp.TermsOf(st.Compute, st.ComputeSamples, st.ComputeWorst), VisionGFLOPS: a.cfg.Worker.Images().Rate()},
		Started: a.started, Time: time.Now(), Draining: a.life.Leaving()}
	if a.cfg.MemoryTotal > 0 {
		w.MemoryTotal = uint64(a.cfg.MemoryTotal)
		w.MemoryFree = w.MemoryTotal // the budget is planned per pass, not reserved per job
	}
	if st := a.cfg.Worker.Store(); st != nil {
		// The store's figures, and the prefixes a prompt can resume from:
		// the router prices a remote prefill from there.
		s := st.Stats()
		pc := &cp.PrefixCacheInfo{Entries: s.Entries, Bytes: uint64(s.Bytes), Lookups: uint64(s.Lookups), Hits: uint64(s.Hits),
			HitTokens: uint64(s.HitTokens), Misses: uint64(s.Misses), Evictions: uint64(s.Evictions), Salt: uint64(st.Salt())}
		for _, l := range st.Links(cp.MaxCachedPrefixes) {
			pc.Prefixes = append(pc.Prefixes, cp.CachedPrefix{Link: uint64(l.Hash), Tokens: l.Tokens})
		}
		w.PrefixCache = pc
	}
	return w
}

// assign starts prefilling a job and streaming its state.
func (a *Adapter) assign(ctx context.Context, as *cp.Assignment) (*cp.AssignReply, error) {
	rep := &cp.AssignReply{JobID: as.JobID, WorkerID: a.cfg.WorkerID}
	refuse := func(code cp.ErrorCode, format string, args ...any) (*cp.AssignReply, error) {
		msg := fmt.Sprintf(format, args...)
		a.log.Warn("assignment refused", zap.String("job", as.JobID), zap.String("reason", msg))
		a.cfg.Metrics.assignment("refused")
		rep.SetError(code, fmt.Sprintf("prefill worker %s: %s", a.cfg.WorkerID, msg))
		return rep, nil
	}
	place, session, secret, err := a.placement(as)
	if err != nil {
		return refuse(cp.CodeBadRequest, "%v", err)
	}
	// The images are decoded and checked against their pad runs here (a
	// bad one refuses the job at once); the tower runs when the job is
	// queued (its Encode), not in this reply.
	enc := a.cfg.Worker.Images()
	imgs, err := enc.Prepare(as.TokenIDs, as.Images)
	if err == nil {
		err = enc.CheckTower(imgs)
	}
	if err != nil {
		return refuse(cp.CodeBadRequest, "job %s: %v", as.JobID, err)
	}
	deadline := as.Deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(a.cfg.DefaultDeadline)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.life.Admit(); err != nil {
		// The coordinator places the job elsewhere.
		return refuse(cp.CodeUnavailable, "%v", err)
	}
	// A job id is admitted once: a coordinator that took the job over
	// after its predecessor crashed gets the job as it is here, never a
	// second prefill (the new assignment's transfer session is unused).
	if p, held := a.knownLocked(as.JobID); p != nil {
		a.life.Done()
		rep.Accepted, rep.Resumed, rep.Progress = true, true, p
		a.log.Info("assignment of a job held or ended here: resumed", zap.String("job", as.JobID),
			zap.Bool("running", held), zap.String("stage", string(p.Stage)))
		a.cfg.Metrics.assignment("resumed")
		return rep, nil
	}
	sc := kvtransfer.SenderConfig{Job: as.JobID, Session: session, Secret: secret,
		Placement: place, Deadline: deadline, Timeouts: a.cfg.Transfer, Conns: a.cfg.TransferConns}
	if b := as.AppendTokens; b > 0 {
		// The ranks hold the rows of the first b tokens: send the rest,
		// naming the base by this worker's own chain over its own tokens,
		// which the ranks check against the entry they restored.
		chain := prefixkey.Chain(prefixkey.SHA256, a.salt(), prefixkey.Fold(as.TokenIDs, imgs.Keys(0))[:b])
		sc.Base, sc.BaseKey = b, uint64(chain[len(chain)-1])
	}
	snd, err := kvtransfer.NewSender(sc)
	if err != nil {
		a.life.Done()
		return refuse(cp.CodeBadRequest, "%v", err)
	}
	j := &job{id: as.JobID, sender: snd, tokens: len(as.TokenIDs), assigned: time.Now(), layers: a.cfg.Worker.Model().NumLayers}
	spec := worker.Spec{ID: as.JobID, Tokens: as.TokenIDs, Sink: sink.Suffix(snd, sc.Base), Deadline: deadline,
		Progress: func(p scheduler.Progress) { a.progress(j, p) }}
	if imgs != nil {
		spec.Images = imgs.Keys(0)
		spec.Encode = func(ctx context.Context) ([]model.Media, error) {
			feats, err := enc.Features(ctx, imgs)
			if err != nil {
				return nil, err
			}
			return imgs.Media(feats, 0), nil
		}
	}
	h, err := a.cfg.Worker.Submit(spec)
	if err != nil {
		snd.Abort(err)
		a.life.Done()
		return refuse(cp.CodeUnavailable, "%v", err)
	}
	j.handle = h
	a.jobs[as.JobID] = j
	go a.wait(j)
	rep.Accepted = true
	a.cfg.Metrics.assignment("accepted")
	a.log.Info("job assigned", zap.String("job", as.JobID), zap.Int("tokens", j.tokens), zap.Int("ranks", len(as.Placement)))
	return rep, nil
}

// salt seeds the prefix-key chain as the decode ranks seed theirs: the
// model's identity and the cache dtype.
func (a *Adapter) salt() prefixkey.Hash {
	if st := a.cfg.Worker.Store(); st != nil {
		return st.Salt()
	}
	return prefixkey.Salt(a.cfg.ModelID, uint8(a.cfg.Worker.LatentDType()))
}

// placement checks the assignment and routes each layer to its stage's
// ranks' kvtransfer endpoints, each rank getting its tensor rank's slice
// (the whole layer when unsplit).
func (a *Adapter) placement(as *cp.Assignment) (*kvtransfer.Sharded, string, []byte, error) {
	c := a.cfg.Worker.Model()
	switch {
	case as.WorkerID != a.cfg.WorkerID:
		return nil, "", nil, fmt.Errorf("the assignment is addressed to %s", as.WorkerID)
	case as.Role != cp.RolePrefill:
		return nil, "", nil, fmt.Errorf("role %s: a prefill worker takes the prefill role", as.Role)
	case as.Placement[len(as.Placement)-1].Layers.End != c.NumLayers:
		return nil, "", nil, fmt.Errorf("the placement ends at layer %d, the model has %d layers", as.Placement[len(as.Placement)-1].Layers.End, c.NumLayers)
	}
	// kvtransfer sends a job under one session: every rank registers the
	// same id and secret.
	first := as.Placement[0]
	layers := map[int][]kvtransfer.Dest{}
	for i, p := range as.Placement {
		if p.SessionID != first.SessionID || string(p.Secret) != string(first.Secret) {
			return nil, "", nil, fmt.Errorf("placement rank %d has another transfer session than rank 0: a job has one session for every rank", i)
		}
		d := kvtransfer.Dest{Endpoint: p.Transfer, Shard: model.Shard{Rank: p.TensorRank, Ranks: p.TensorRanks}}
		for L := p.Layers.First; L < p.Layers.End; L++ {
			layers[L] = append(layers[L], d)
		}
	}
	place, err := kvtransfer.NewSharded(c, layers)
	if err != nil {
		return nil, "", nil, fmt.Errorf("decode group %s: %w", as.GroupID, err)
	}
	return place, first.SessionID, first.Secret, nil
}

// progress reports a job's layers (from the pass goroutine: it must be
// quick).
func (a *Adapter) progress(j *job, p scheduler.Progress) {
	now := time.Now()
	last := p.Final && p.Layer == p.Layers
	j.mu.Lock()
	j.layer = p.Layer
	if last {
		j.computed = now
		j.bytesThen = j.sender.Stats().BytesSent
	}
	due := last || now.Sub(j.lastSent) >= a.cfg.ProgressEvery
	if due {
		j.lastSent = now
	}
	j.mu.Unlock()
	if !due {
		return
	}
	// Tokens counts the prompt tokens whose every layer is done.
	stage, done := cp.StatePrefilling, p.Done
	if last {
		// Prefill compute is over; what is left is the transfer tail.
		stage, done = cp.StateTransferring, p.Total
	}
	a.publish(cp.WorkerProgress(a.cfg.WorkerID, j.id), &cp.Progress{JobID: j.id, WorkerID: a.cfg.WorkerID, Stage: stage, Time: now,
		Layers: &cp.LayerProgress{Done: p.Layer, Total: p.Layers}, Tokens: done, Cached: p.Cached, Elapsed: p.Elapsed})
	if last {
		// Make sure the server has it before the last layer's state leaves:
		// the decode group's first token, which follows the commit, must
		// not overtake it on its way to the coordinator.
		if err := a.cfg.Conn.FlushTimeout(time.Second); err != nil {
			a.log.Warn("flush progress", zap.String("job", j.id), zap.Error(err))
		}
	}
}

// wait reports the job's end: done once every rank committed its state.
func (a *Adapter) wait(j *job) {
	defer a.life.Done()
	err := j.handle.Wait(context.Background())
	res := j.handle.Result()
	now := time.Now()
	a.mu.Lock()
	reason := j.cancelled
	a.mu.Unlock()

	st := j.sender.Stats()
	a.cfg.Metrics.transfer(st)
	p := &cp.Progress{JobID: j.id, WorkerID: a.cfg.WorkerID, Time: now, Tokens: res.Tokens, Cached: res.Cached,
		Bytes: uint64(max(st.BytesSent, 0)), Elapsed: res.Prefill}
	j.mu.Lock()
	layer, computed, bytesThen := j.layer, j.computed, j.bytesThen
	j.mu.Unlock()
	switch {
	case err == nil:
		p.Stage = cp.StateDone
		p.Measured = a.measured(computed, now, st.BytesSent-bytesThen)
		a.log.Info("job prefilled and transferred", zap.String("job", j.id), zap.Int("tokens", res.Tokens),
			zap.Duration("wait", res.Wait), zap.Duration("prefill", res.Prefill), zap.Int64("bytes", st.BytesSent))
	case reason != "" || errors.Is(err, scheduler.ErrCancelled):
		if reason == "" {
			reason = "cancelled on the prefill worker"
		}
		p.Stage = cp.StateCancelled
		p.Error = &cp.JobError{Code: cp.CodeConflict, Worker: a.cfg.WorkerID, Message: reason}
	default:
		p.Stage = cp.StateFailed
		p.Error = &cp.JobError{Code: cp.CodeInternal, Worker: a.cfg.WorkerID, Message: err.Error()}
		if computed.IsZero() {
			// The pass stopped inside the model: name the layer it was on.
			p.Error.Layer = &layer
		}
		a.log.Warn("job failed", zap.String("job", j.id), zap.Error(err))
	}
	a.mu.Lock()
	delete(a.jobs, j.id)
	a.ended.Put(p, now)
	a.mu.Unlock()
	a.publish(cp.WorkerProgress(a.cfg.WorkerID, j.id), p)
	// At the server before anything later from this worker (a drained
	// worker's deregistration next): coordinators learn the job's end
	// first.
	if a.cfg.Conn.IsConnected() {
		if err := a.cfg.Conn.FlushTimeout(time.Second); err != nil {
			a.log.Warn("flush the final report", zap.String("job", j.id), zap.Error(err))
		}
	}
}

// knownLocked is what the worker knows of job id: its progress while it
// runs (held), or its final report when it ended here recently. A job
// cancelled here is not known: it may be assigned again (a coordinator
// that stopped cleanly cancelled it and handed it back to the queue).
func (a *Adapter) knownLocked(id string) (p *cp.Progress, held bool) {
	if j := a.jobs[id]; j != nil {
		return j.snapshot(a.cfg.WorkerID), true
	}
	if p, ok := a.ended.Get(id, time.Now()); ok {
		if p.Stage == cp.StateCancelled {
			a.ended.Drop(id)
			return nil, false
		}
		return p, false
	}
	return nil, false
}

// snapshot is a running job's progress now.
func (j *job) snapshot(worker string) *cp.Progress {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := &cp.Progress{JobID: j.id, WorkerID: worker, Stage: cp.StatePrefilling, Time: time.Now(),
		Layers: &cp.LayerProgress{Done: j.layer, Total: j.layers}}
	if !j.computed.IsZero() {
		p.Stage = cp.StateTransferring
	}
	return p
}

// status answers what the worker knows of a job, changing nothing.
func (a *Adapter) status(_ context.Context, req *cp.JobStatusRequest) (*cp.JobStatusReply, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if j := a.jobs[req.JobID]; j != nil {
		return cp.StatusOf(req.JobID, a.cfg.WorkerID, j.snapshot(a.cfg.WorkerID), true), nil
	}
	p, _ := a.ended.Get(req.JobID, time.Now())
	return cp.StatusOf(req.JobID, a.cfg.WorkerID, p, false), nil
}

// measured are the figures of the latest pass and of this job's transfer
// tail: the bytes sent between the end of prefill and the commit, over that
// time, measure the link while it had a backlog (small tails say little,
// so they are left out).
func (a *Adapter) measured(computed, committed time.Time, tailBytes int64) *cp.Rates {
	st := a.cfg.Worker.Stats()
	r := &cp.Rates{PassFloor: st.PassFloor, ReadBytesPerSec: st.ReadBytesPerSec}
	if lp := st.LastPass; lp != nil && lp.Stats.Compute > 0 && lp.Stats.Tokens > 0 {
		r.PrefillTokensPerSec = float64(lp.Stats.Tokens) / lp.Stats.Compute.Seconds()
	}
	if tail := committed.Sub(computed); !computed.IsZero() && tail > 0 && tailBytes >= 1<<20 {
		r.LinkBytesPerSec = float64(tailBytes) / tail.Seconds()
	}
	return r
}

// cancelJob cancels a job: the pass drops it at the next layer and its
// sender aborts, so the decode ranks free their buffers.
func (a *Adapter) cancelJob(_ context.Context, req *cp.CancelRequest) (*cp.CancelReply, error) {
	a.mu.Lock()
	j := a.jobs[req.JobID]
	if j != nil {
		j.cancelled = req.Reason
		if j.cancelled == "" {
			j.cancelled = "cancelled by the coordinator"
		}
	}
	a.mu.Unlock()
	if j == nil || !a.cfg.Worker.Cancel(req.JobID) {
		return cancelRefused(req.JobID, cp.CodeNotFound, fmt.Sprintf("prefill worker %s: job %s is not running here", a.cfg.WorkerID, req.JobID)), nil
	}
	a.log.Info("job cancelled", zap.String("job", req.JobID), zap.String("reason", req.Reason))
	return &cp.CancelReply{JobID: req.JobID, State: cp.StateCancelled}, nil
}

func (a *Adapter) publish(subject string, m cp.Message) {
	if err := cp.Publish(a.cfg.Conn, subject, m); err != nil {
		a.log.Warn("publish failed", zap.String("subject", subject), zap.Error(err))
	}
}

func cancelRefused(job string, code cp.ErrorCode, msg string) *cp.CancelReply {
	rep := &cp.CancelReply{JobID: job}
	rep.SetError(code, msg)
	return rep
}
