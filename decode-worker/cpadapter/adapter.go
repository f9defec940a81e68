// Package cpadapter is a decode rank's control-plane mode: it keeps the
// rank registered in the worker registry (heartbeats with its layers, free
// memory, load and measured rates) and, on rank 0 (the group's front door),
// serves the coordinator's assignments and cancellations and publishes each
// job's tokens and progress on NATS.
//
// The coordinator assigns a job to rank 0 only: rank 0 admits the sequence
// on every rank over the mesh, carrying the job's transfer session (one
// session id and secret for every rank of a job, as kvtransfer expects) to
// the others, and a cancellation on rank 0 frees the sequence on every
// rank. The other ranks only beat.
package cpadapter

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
	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/tokenizer"
)

// Config configures one rank's adapter.
type Config struct {
	Conn     *nats.Conn
	Registry *cp.Registry
	// WorkerID is this rank's id in the registry.
	WorkerID string
	// Worker is this rank's pipeline worker; Layout and Rank place it.
	Worker *pipeline.Worker
	Layout *rank.Layout
	Rank   int
	// Model is the model's configuration; ModelID its identity,
	// modelinfo.Identity of the model directory, which names membership of
	// one model.
	Model   *model.Config
	ModelID string
	// LatentDType is the rank's MLA cache dtype, by default BF16, for the
	// memory it reports.
	LatentDType model.DType
	// Tokenizer detokenizes the tokens rank 0 publishes and finds stop
	// texts; nil publishes token ids only and refuses stop texts.
	Tokenizer *tokenizer.Tokenizer
	// Images decodes rank 0's jobs' images and runs its vision tower (an
	// encoder without a tower refuses jobs whose images the group would
	// prefill); nil refuses every job with images.
	Images *imagejob.Encoder
	// Backend names the compute backend; default "cpu".
	Backend string
	Version string
	// Advertise is the host:port other workers reach this rank's
	// kvtransfer server on, by default the layout's endpoint.
	Advertise string
	// Heartbeat is the interval between heartbeats, by default a third of
	// the registry's TTL.
	Heartbeat time.Duration
	// TransferDeadline bounds a remote job's transfer when its assignment
	// has no deadline; default 30 min.
	TransferDeadline time.Duration
	// Handlers is the number of assignments rank 0 admits at once, by
	// default 256; an admission waits for a trip around the ring, and they
	// travel it together. An assignment beyond them is refused
	// unavailable at once, and the coordinator places it again after a
	// pause, rather than waiting unanswered past its assignment timeout.
	Handlers int
	// Remember is how long rank 0 keeps a finished job's final report, by
	// default 1 h and for at most 4096 jobs, so that a coordinator taking the
	// job over after a crash learns how it ended instead of running it
	// again.
	Remember time.Duration
	// Metrics records assignments and the time between tokens, if set;
	// MetricsAddr is the host:port of the rank's /metrics,
	// advertised in heartbeats.
	Metrics     *Metrics
	MetricsAddr string
	Log         *zap.Logger
}

// Adapter is a running control-plane mode of one rank.
type Adapter struct {
	cfg     Config
	lo, hi  int
	started time.Time
	log     *zap.Logger
	hb      *cp.Heartbeat
	cancel  context.CancelFunc
	maxSeq  int

	life    *cp.Lifecycle // taking jobs, draining or closing; the streams
	mu      sync.Mutex
	streams map[string]*stream
	ended   *cp.Ended

	// The group's own prefill as the cost model's terms, fitted to its
	// finished local prefills (rank 0 advertises them).
	cost *costmodel.Model
	fit  *costmodel.Fitter
}

// Start registers the rank and, on rank 0, starts serving assignments.
func Start(ctx context.Context, cfg Config) (*Adapter, error) {
	switch {
	case cfg.Conn == nil || cfg.Registry == nil || cfg.Worker == nil || cfg.Layout == nil || cfg.Model == nil:
		return nil, errors.New("decode adapter: a NATS connection, a registry, a worker, a layout and a model config are required")
	case cfg.Rank < 0 || cfg.Rank > cfg.Layout.Last():
		return nil, fmt.Errorf("decode adapter: rank %d is not in group %q", cfg.Rank, cfg.Layout.Group)
	}
	if err := cp.CheckID(cfg.WorkerID); err != nil {
		return nil, fmt.Errorf("decode adapter: worker id: %w", err)
	}
	if err := cp.CheckID(cfg.Layout.Group); err != nil {
		return nil, fmt.Errorf("decode adapter: group name %q is not a protocol id: %w", cfg.Layout.Group, err)
	}
	if cfg.LatentDType == 0 {
		cfg.LatentDType = model.BF16
	}
	if cfg.Backend == "" {
		cfg.Backend = "cpu"
	}
	if cfg.Advertise == "" {
		cfg.Advertise = cfg.Layout.Ranks[cfg.Rank].Endpoint
	}
	if cfg.TransferDeadline <= 0 {
		cfg.TransferDeadline = 30 * time.Minute
	}
	if cfg.Handlers <= 0 {
		cfg.Handlers = 256
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	spec := cfg.Layout.Ranks[cfg.Rank]
	a := &Adapter{cfg: cfg, lo: spec.Lo, hi: spec.Hi, started: time.Now(), streams: map[string]*stream{}, ended: cp.NewEnded(0, cfg.Remember),
		log: cfg.Log.With(zap.String("worker", cfg.WorkerID)), maxSeq: 1 << 20,
		cost: costmodel.New(&cfg.Model.Config, cfg.LatentDType.Size()), fit: costmodel.NewFitter(costmodel.Compute{})}
	// A rank holds its share of every sequence of the group, whichever
	// rank took the job.
	a.life = cp.NewLifecycle(cfg.WorkerID, "decode rank", func() int { return cfg.Worker.Stats().Sequences }, a.log)
	// Serving before registering: a coordinator that finds the rank in the
	// registry finds it serving. Assignments are refused until the registry
	// shows it (the coordinator tells a restarted worker's old jobs from
	// its new ones by that order).
	serveCtx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	queue := "tandem-worker-" + cfg.WorkerID
	// A failed subscription fails New; the others end with serveCtx.
	var errs []error
	if cfg.Rank == 0 {
		// Each assignment is answered on a goroutine of its own, up to
		// Handlers at once (a handler per subscription queued a burst
		// of 200 behind 16 admissions in progress); the rest are refused
		// busy at once.
		admitting := make(chan struct{}, cfg.Handlers)
		_, err := cp.Subscribe(cfg.Conn, cp.WorkerAssign(cfg.WorkerID), queue, serveCtx.Done(), func(m *nats.Msg) {
			select {
			case admitting <- struct{}{}:
				go func() {
					defer func() { <-admitting }()
					cp.Answer(serveCtx, m, a.assign)
				}()
			default:
				cp.Answer(serveCtx, m, a.busy)
			}
		})
		_, errCancel := cp.Serve(serveCtx, cfg.Conn, cp.WorkerCancel(cfg.WorkerID), queue, a.cancelJob)
		_, errStatus := cp.Serve(serveCtx, cfg.Conn, cp.WorkerStatus(cfg.WorkerID), queue, a.status)
		errs = append(errs, err, errCancel, errStatus)
	}
	// Every rank drains on request (the group takes no jobs while any of
	// its ranks drains) and lists and drops its share of the group's
	// prefix cache.
	_, errDrain := cp.Serve(serveCtx, cfg.Conn, cp.WorkerDrain(cfg.WorkerID), queue, a.life.DrainRequest)
	_, errCache := cp.Serve(serveCtx, cfg.Conn, cp.WorkerCache(cfg.WorkerID), queue, a.cacheRequest)
	errs = append(errs, errDrain, errCache)
	if err := errors.Join(append(errs, cp.Flushed(cfg.Conn))...); err != nil {
		cancel()
		return nil, fmt.Errorf("decode adapter: %w", err)
	}
	hb, err := cp.StartHeartbeat(ctx, cfg.Registry, cfg.Heartbeat, a.info, a.log)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("decode adapter: %w", err)
	}
	a.hb = hb
	a.life.Registered(hb.Beat)
	a.log.Info("decode rank registered", zap.String("group", cfg.Layout.Group), zap.Int("rank", cfg.Rank),
		zap.Int("lo", a.lo), zap.Int("hi", a.hi), zap.String("advertise", cfg.Advertise))
	return a, nil
}

// Close stops taking assignments, cancels the jobs still running on rank
// 0, whose coordinators learn it from their progress, waits until their
// last messages are out, and deregisters the rank.
func (a *Adapter) Close(ctx context.Context) error {
	a.life.Close()
	a.mu.Lock()
	ids := make([]string, 0, len(a.streams))
	for id := range a.streams {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	a.cancel()
	for _, id := range ids {
		_ = a.cfg.Worker.Cancel(ctx, id)
	}
	var errs []error
	if err := a.life.Wait(ctx); err != nil {
		errs = append(errs, fmt.Errorf("decode adapter: %d jobs still ending: %w", len(ids), err))
	}
	errs = append(errs, a.hb.Stop(ctx))
	return errors.Join(errs...)
}

// Drain stops taking jobs and waits until the sequences this rank holds
// end, or ctx ends; Close then cancels whatever is left. The registry shows
// the rank draining at once, so that routers pass its group by, and rank 0
// refuses assignments that still come as unavailable, so that coordinators
// place them elsewhere.
func (a *Adapter) Drain(ctx context.Context) error {
	a.life.StartDrain("")
	if err := a.life.Wait(ctx); err != nil {
		return fmt.Errorf("decode adapter: drain: jobs still running: %w", err)
	}
	// The other ranks hold their share of the head's sequences until the
	// head frees them around the ring: a moment after the head's streams
	// end.
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		n := a.cfg.Worker.Stats().Sequences
		if n == 0 {
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("decode adapter: drain: %d sequences still held: %w", n, ctx.Err())
		}
	}
}

// Draining is closed once a drain has started by Drain or a coordinator's
// DrainRequest; the process should then drain and exit.
func (a *Adapter) Draining() <-chan struct{} { return a.life.Draining() }

// NotReady says why the rank takes no jobs now, or is nil when it takes
// them.
func (a *Adapter) NotReady() error { return a.life.NotReady() }

// Beat sends a heartbeat now, as when the ring is formed.
func (a *Adapter) Beat() { a.life.Beat() }

// info is this rank's heartbeat.
func (a *Adapter) info() cp.WorkerInfo {
	st := a.cfg.Worker.Stats()
	w := cp.WorkerInfo{ID: a.cfg.WorkerID, Kind: cp.KindDecode, Backend: a.cfg.Backend, Model: a.cfg.ModelID,
		Version: a.cfg.Version, GroupID: a.cfg.Layout.Group, Rank: a.cfg.Rank, GroupSize: len(a.cfg.Layout.Ranks),
		Layers:     cp.LayerRange{First: a.lo, End: a.hi},
		QueueDepth: st.Queued, Active: st.Sequences, PrefillChunk: a.cfg.Worker.PrefillChunk(),
		Endpoints: cp.Endpoints{Transfer: a.cfg.Advertise, Pipeline: a.cfg.Advertise, Metrics: a.cfg.MetricsAddr},
		Started:   a.started, Time: time.Now(),
		// A rank whose ring is not formed cannot admit: it takes no jobs.
		Draining: a.life.Leaving() || !st.Formed,
	}
	if sh := a.cfg.Layout.Shard(a.cfg.Rank); sh.Split() {
		w.TensorRank, w.TensorRanks = sh.Rank, sh.Ranks // absent when unsplit: old coordinators read it alike
	}
	if st.BudgetBytes > 0 {
		w.MemoryTotal = uint64(st.BudgetBytes)
		w.MemoryFree = uint64(max(st.BudgetBytes-st.ReservedBytes, 0))
		w.MaxSeqTokens = a.maxTokens(int64(w.MemoryFree))
	}
	if st.DecodeSteps > 0 && st.StepTime > 0 {
		w.Rates.DecodeTokensPerSec = float64(st.DecodeSteps) / st.StepTime.Seconds()
	}
	if a.cfg.Rank == 0 {
		c, n, worst := a.fit.Compute()
		w.Rates.Compute = cp.TermsOf(c, n, worst)
		if a.cfg.Images != nil {
			w.Rates.VisionGFLOPS = a.cfg.Images.Rate()
		}
	}
	w.PrefixCache = cacheInfo(&st)
	return w
}

// observeLocal fits the group's prefill terms to a local prefill of prompt
// tokens (all but the last prefilled, in its steps, less the cached prefix
// of cached tokens): the ranks' compute time for its prefill steps, summed
// over the ranks, and the part of it in the MLA attention. Compute, not the
// wall time: the ranks overlap a prompt's chunks, less so the fewer its
// chunks, and the router prices that overlap from the ranks' layers
// (costmodel.Load.LocalStages); a fit to wall times took a 4096-token
// prompt's overlap for a faster rate than a 256-token one's.
func (a *Adapter) observeLocal(prompt, cached int, tm pipeline.Timing) {
	n := prompt - 1
	if n-cached < 1 || tm.PrefillCompute <= 0 {
		return
	}
	s := costmodel.Sample{Work: a.cost.Work(cached, n), Calls: tm.PrefillSteps * a.cost.Layers,
		Took: tm.PrefillCompute, Attention: tm.PrefillAttention}
	if err := a.fit.Add(s); err != nil {
		a.log.Debug("local prefill not fitted", zap.Error(err))
	}
}

// cacheInfo is the heartbeat's account of the rank's prefix cache (nil
// when off): its counters and, from the head, the prefixes a prompt can
// resume from, which the router prices.
func cacheInfo(st *pipeline.Stats) *cp.PrefixCacheInfo {
	c := st.Cache
	if c == (prefixcache.Stats{}) && st.CacheSalt == 0 {
		return nil // off (or nothing yet to say)
	}
	ci := &cp.PrefixCacheInfo{Entries: c.Entries, Bytes: uint64(max(c.Bytes, 0)), Lookups: uint64(c.Lookups), Hits: uint64(c.Hits),
		HitTokens: uint64(c.HitTokens), Misses: uint64(c.Misses), Evictions: uint64(c.Evictions), Salt: uint64(st.CacheSalt),
		Stride: st.CacheStride}
	for _, l := range st.CacheLinks[:min(len(st.CacheLinks), cp.MaxCachedPrefixes)] {
		ci.Prefixes = append(ci.Prefixes, cp.CachedPrefix{Link: uint64(l.Hash), Tokens: l.Tokens})
	}
	return ci
}

// stateBytes is what a sequence of n tokens reserves on this rank: its
// tensor rank's slice of the KDA state and the whole MLA cache, as the
// rank's table reserves it.
func (a *Adapter) stateBytes(n int) int64 {
	return rank.ShardStateBytes(a.cfg.Model, a.lo, a.hi, n, a.cfg.LatentDType, a.cfg.Layout.Shard(a.cfg.Rank))
}

// maxTokens is the longest sequence whose state on this rank's layers fits
// in free bytes (the state grows linearly with the tokens).
func (a *Adapter) maxTokens(free int64) int {
	fixed := a.stateBytes(0)
	per := a.stateBytes(1) - fixed
	switch {
	case free < fixed:
		return 0
	case per <= 0:
		return a.maxSeq
	}
	return int(min(int64(a.maxSeq), (free-fixed)/per))
}

// assign admits a job on the group (rank 0).
func (a *Adapter) assign(ctx context.Context, as *cp.Assignment) (*cp.AssignReply, error) {
	rep := &cp.AssignReply{JobID: as.JobID, WorkerID: a.cfg.WorkerID}
	refuse := func(code cp.ErrorCode, format string, args ...any) (*cp.AssignReply, error) {
		msg := fmt.Sprintf(format, args...)
		a.log.Warn("assignment refused", zap.String("job", as.JobID), zap.String("reason", msg))
		a.cfg.Metrics.assignment("refused")
		rep.SetError(code, fmt.Sprintf("decode group %s (rank 0 %s): %s", a.cfg.Layout.Group, a.cfg.WorkerID, msg))
		return rep, nil
	}
	req, err := a.request(as)
	if err != nil {
		return refuse(cp.CodeBadRequest, "%v", err)
	}
	a.mu.Lock()
	if err := a.life.Admit(); err != nil {
		a.mu.Unlock()
		// The coordinator places the job elsewhere.
		return refuse(cp.CodeUnavailable, "%v", err)
	}
	// A job id is admitted once: a coordinator that took the job over
	// after its predecessor crashed gets the job as it is here, never a
	// second run.
	if p, held := a.knownLocked(as.JobID); p != nil {
		a.life.Done()
		a.mu.Unlock()
		rep.Accepted, rep.Resumed, rep.Progress = true, true, p
		a.log.Info("assignment of a job held or ended here: resumed", zap.String("job", as.JobID),
			zap.Bool("running", held), zap.String("stage", string(p.Stage)))
		a.cfg.Metrics.assignment("resumed")
		return rep, nil
	}
	s := a.newStream(as, req) // its end calls done
	a.streams[as.JobID] = s
	a.mu.Unlock()
	req.Sink = s

	subCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := a.cfg.Worker.Submit(subCtx, *req); err != nil {
		s.abandon()
		var refused *pipeline.RefusedError
		switch {
		case errors.As(err, &refused), errors.Is(err, pipeline.ErrNotReady):
			return refuse(cp.CodeUnavailable, "%v", err)
		case ctx.Err() != nil || subCtx.Err() != nil:
			return refuse(cp.CodeUnavailable, "admission did not finish: %v", err)
		}
		return refuse(cp.CodeBadRequest, "%v", err)
	}
	if reason, cancelled := s.admitted(); cancelled {
		// The coordinator gave up on this assignment while it was being
		// admitted: drop the sequence without a word on the job's subjects.
		_ = a.cfg.Worker.Cancel(ctx, as.JobID)
		return refuse(cp.CodeConflict, "cancelled while being admitted: %s", reason)
	}
	rep.Accepted = true
	a.cfg.Metrics.assignment("accepted")
	if rm := req.Remote; rm != nil {
		rep.AppendTokens = *rm.Appended // what the prefill worker is to send after
	}
	rep.ReservedBytes = uint64(a.stateBytes(len(req.Tokens) + as.CachedTokens + req.MaxTokens))
	a.log.Info("job admitted", zap.String("job", as.JobID), zap.Int("tokens", len(req.Tokens)),
		zap.Int("cached", as.CachedTokens), zap.Int("append_to", rep.AppendTokens), zap.Int("max_tokens", req.MaxTokens))
	return rep, nil
}

// busy refuses an assignment while Handlers admissions are in progress.
func (a *Adapter) busy(_ context.Context, as *cp.Assignment) (*cp.AssignReply, error) {
	rep := &cp.AssignReply{JobID: as.JobID, WorkerID: a.cfg.WorkerID}
	rep.SetError(cp.CodeUnavailable, fmt.Sprintf("decode group %s (rank 0 %s): admitting %d jobs already; try again",
		a.cfg.Layout.Group, a.cfg.WorkerID, a.cfg.Handlers))
	return rep, nil
}

// request turns an assignment into the group's request (without its sink).
func (a *Adapter) request(as *cp.Assignment) (*pipeline.Request, error) {
	l := a.cfg.Layout
	switch {
	case as.WorkerID != a.cfg.WorkerID:
		return nil, fmt.Errorf("the assignment is addressed to %s", as.WorkerID)
	case as.Role != cp.RoleDecode:
		return nil, fmt.Errorf("role %s: a decode group takes the decode role", as.Role)
	case as.GroupID != l.Group:
		return nil, fmt.Errorf("the assignment is for group %s", as.GroupID)
	case len(as.Placement) != len(l.Ranks):
		return nil, fmt.Errorf("the placement has %d ranks, the group %d", len(as.Placement), len(l.Ranks))
	case as.Sampling.MaxTokens < 1:
		return nil, fmt.Errorf("max_tokens is %d: the coordinator must give at least 1", as.Sampling.MaxTokens)
	case len(as.Sampling.Stop.Texts) > 0 && a.cfg.Tokenizer == nil:
		return nil, errors.New("stop texts need a tokenizer, and this model directory has none: give stop token ids")
	}
	for i, p := range as.Placement {
		if r := l.Ranks[i]; p.Layers.First != r.Lo || p.Layers.End != r.Hi {
			return nil, fmt.Errorf("placement rank %d holds layers %v, the group's rank %d holds [%d,%d)", i, p.Layers, i, r.Lo, r.Hi)
		}
		// The prefill worker cuts each rank's state by these fields.
		if got, want := (model.Shard{Rank: p.TensorRank, Ranks: max(p.TensorRanks, 1)}), l.Shard(i); got != want {
			return nil, fmt.Errorf("placement rank %d is tensor rank %d of %d, the group's rank %d is %s", i, p.TensorRank, p.TensorRanks, i, want)
		}
	}
	s := as.Sampling
	req := &pipeline.Request{ID: as.JobID, Tokens: as.TokenIDs, MaxTokens: s.MaxTokens, Stop: s.Stop.TokenIDs,
		Sampling: sampling.Params{Temperature: s.Temperature, TopK: s.TopK, TopP: s.TopP, Seed: s.Seed}, Grammar: s.Grammar, NoDraft: s.NoDraft}
	if err := a.images(as, req); err != nil {
		return nil, err
	}
	if as.CachedTokens == 0 {
		return req, nil
	}
	// Every rank of a job receives its layers under the job's one transfer
	// session; rank 0's entry carries its id and secret.
	own := as.Placement[0]
	if own.SessionID == "" || len(own.Secret) == 0 {
		return nil, errors.New("a remote job's placement gives rank 0 no transfer session")
	}
	for i, p := range as.Placement {
		if p.SessionID != own.SessionID {
			return nil, fmt.Errorf("placement rank %d has transfer session %q, rank 0 %q: a job has one session for every rank", i, p.SessionID, own.SessionID)
		}
	}
	deadline := as.Deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(a.cfg.TransferDeadline)
	}
	req.Remote = &pipeline.Remote{Tokens: as.CachedTokens, Deadline: deadline, Prompt: as.CachedTokenIDs, Append: as.AppendTokens, Appended: new(int)}
	for range as.Placement {
		req.Remote.Sessions = append(req.Remote.Sessions, pipeline.Session{ID: own.SessionID, Secret: own.Secret})
	}
	return req, nil
}

// cancelJob cancels a job on the group (rank 0); every rank frees it.
func (a *Adapter) cancelJob(ctx context.Context, req *cp.CancelRequest) (*cp.CancelReply, error) {
	a.mu.Lock()
	s := a.streams[req.JobID]
	a.mu.Unlock()
	if s == nil {
		return cancelRefused(req.JobID, cp.CodeNotFound, fmt.Sprintf("decode group %s: job %s is not running here", a.cfg.Layout.Group, req.JobID)), nil
	}
	if !s.markCancelled(req.Reason) {
		// Still being admitted: the assignment's handler drops it.
		a.log.Info("job cancelled during its admission", zap.String("job", req.JobID), zap.String("reason", req.Reason))
		return &cp.CancelReply{JobID: req.JobID, State: cp.StateCancelled}, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.cfg.Worker.Cancel(cctx, req.JobID); err != nil {
		return cancelRefused(req.JobID, cp.CodeConflict, fmt.Sprintf("decode group %s: cancel job %s: %v", a.cfg.Layout.Group, req.JobID, err)), nil
	}
	a.log.Info("job cancelled", zap.String("job", req.JobID), zap.String("reason", req.Reason))
	return &cp.CancelReply{JobID: req.JobID, State: cp.StateCancelled, FreedBytes: s.reserved}, nil
}

// knownLocked is what rank 0 knows of job id: its latest report while it
// runs (held), or its final report when it ended here recently. A job
// cancelled here is not known: it may be assigned again (a coordinator
// that stopped cleanly cancelled it and handed it back to the queue).
func (a *Adapter) knownLocked(id string) (p *cp.Progress, held bool) {
	if s := a.streams[id]; s != nil {
		// A final report: the stream is only putting the job away.
		p := s.snapshot()
		return p, !p.Stage.Final()
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

// status answers what rank 0 knows of a job, changing nothing.
func (a *Adapter) status(_ context.Context, req *cp.JobStatusRequest) (*cp.JobStatusReply, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.streams[req.JobID]; s != nil {
		return cp.StatusOf(req.JobID, a.cfg.WorkerID, s.snapshot(), true), nil
	}
	p, _ := a.ended.Get(req.JobID, time.Now())
	return cp.StatusOf(req.JobID, a.cfg.WorkerID, p, false), nil
}

// done forgets a finished stream, remembering its final report (nil: the
// sequence was never admitted, or was dropped during its admission).
func (a *Adapter) done(id string, final *cp.Progress) {
	a.mu.Lock()
	delete(a.streams, id)
	if final != nil {
		a.ended.Put(final, time.Now())
	}
	a.mu.Unlock()
	a.life.Done()
}

func cancelRefused(job string, code cp.ErrorCode, msg string) *cp.CancelReply {
	rep := &cp.CancelReply{JobID: job}
	rep.SetError(code, msg)
	return rep
}

// images decodes the assignment's images, places them on the pad runs of
// the prompt rank 0 sees (the remote part, when sent, then its own) and
// gives the request their runs and hashes, and the tower's run when the
// group prefills any of them. The tower runs after admission, off the
// assignment's reply.
func (a *Adapter) images(as *cp.Assignment, req *pipeline.Request) error {
	if len(as.Images) == 0 {
		return nil
	}
	enc := a.cfg.Images
	if enc == nil {
		return fmt.Errorf("job %s has %d images and this decode group takes none", as.JobID, len(as.Images))
	}
	prompt := as.TokenIDs
	if as.CachedTokenIDs != nil {
		prompt = append(slices.Clone(as.CachedTokenIDs), as.TokenIDs...)
	}
	j, err := enc.Prepare(prompt, as.Images)
	if err != nil {
		return fmt.Errorf("job %s: %w", as.JobID, err)
	}
	// A run may straddle the remote part's end: the group then prefills
	// the rest of it with its window of the rows.
	for _, k := range j.Keys(0) {
		req.Images = append(req.Images, pipeline.Image{At: k.At, Len: k.Len, Hash: k.Hash})
	}
	if !j.Needs(as.CachedTokens) {
		return nil
	}
	if err := enc.CheckTower(j); err != nil {
		return fmt.Errorf("job %s: %w", as.JobID, err)
	}
	req.Encode = func(ctx context.Context) ([][]float32, error) {
		t0 := time.Now()
		feats, err := enc.Features(ctx, j)
		if err == nil {
			a.log.Info("image features ready", zap.String("job", as.JobID), zap.Int("images", len(feats)),
				zap.Duration("decode", j.Decode.Round(time.Millisecond)), zap.Duration("tower", time.Since(t0).Round(time.Millisecond)))
		}
		return feats, err
	}
	return nil
}
