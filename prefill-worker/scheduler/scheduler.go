// Package scheduler batches prefill jobs into weight passes. Jobs that
// arrive while a pass runs wait for the next one; every job waiting when a
// pass starts shares it (each layer's weights are read once and applied to
// all of them), as far as the memory budget allows: the planner decides
// which tokens of which jobs go in, splitting long prompts into super-chunks
// that continue in later passes. Jobs in progress go first, then new jobs in
// arrival order.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/executor"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
)

// Config wires a scheduler.
type Config struct {
	Exec   *executor.Executor
	Costs  planner.Costs
	Budget int64
	// Depth is the prefetch depth of every pass; the streamer's ring holds
	// Depth+1 slots.
	Depth   int
	MaxTile int
	// SinkQueue is each job's queue of layer states (default 4);
	// SinkTimeout how long a pass waits for room in it before failing the
	// job (default a minute); CloseTimeout how long the sink may take to
	// commit the state after the last layer (default 5 minutes).
	SinkQueue                 int
	SinkTimeout, CloseTimeout time.Duration
	Log                       *zap.Logger
	// OnPass, if set, is called after every pass, before the pass's jobs
	// finish (so a job's Wait returning means its passes were reported).
	OnPass func(PassReport)
	// OnLayer, if set, is called after every layer of a pass, from the
	// pass's goroutine (it must be quick).
	OnLayer func(executor.Progress)
	// SerialEncode runs jobs' Encode (the vision tower, on the pass's
	// backend) in the pass loop, between passes, instead of beside them:
	// for a device backend, whose ops must not be issued from two
	// goroutines at once.
	SerialEncode bool
}

// PassReport describes a finished pass.
type PassReport struct {
	Pass  int
	Plan  planner.Plan
	Stats executor.Stats
	Err   error
}

// Stats are the scheduler's counters.
type Stats struct {
	Queued, InProgress              int
	Passes                          int
	Completed, Failed, Cancelled    int
	TokensPrefilled, BytesRead      int64
	ComputeTime, PassTime, ReadWait time.Duration
	LastPass                        *PassReport
}

// Scheduler owns the job queue and runs passes.
type Scheduler struct {
	cfg Config
	log *zap.Logger

	mu       sync.Mutex
	jobs     map[string]*Job
	waiting  []*Job // not started, in arrival order
	progress []*Job // started, not finished, in start order
	encoding []*Job // waiting for the pass loop to run their Encode (SerialEncode)
	wake     chan struct{}
	stats    Stats
	stopped  bool
}

// New returns a scheduler; call Run to start passes.
func New(cfg Config) *Scheduler {
	if cfg.SinkQueue <= 0 {
		cfg.SinkQueue = 4
	}
	if cfg.SinkTimeout <= 0 {
		cfg.SinkTimeout = time.Minute
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 5 * time.Minute
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Scheduler{cfg: cfg, log: log, jobs: make(map[string]*Job), wake: make(chan struct{}, 1)}
}

// ErrStopped is returned by Submit after Run has returned.
var ErrStopped = errors.New("scheduler stopped")

// Submit queues a job for the next pass.
func (s *Scheduler) Submit(spec Spec) (*Job, error) {
	js, err := s.SubmitAll([]Spec{spec})
	if err != nil {
		return nil, err
	}
	return js[0], nil
}

// SubmitAll queues several jobs at once: none or all are queued, and a pass
// that starts after it takes them together.
func (s *Scheduler) SubmitAll(specs []Spec) ([]*Job, error) {
	c := s.cfg.Exec.Model.Cfg
	seen := make(map[string]bool, len(specs))
	for _, spec := range specs {
		if spec.ID == "" {
			return nil, errors.New("scheduler: job id is empty")
		}
		if seen[spec.ID] {
			return nil, fmt.Errorf("scheduler: job %s is given twice", spec.ID)
		}
		seen[spec.ID] = true
		if spec.Sink == nil {
			return nil, fmt.Errorf("scheduler: job %s has no sink", spec.ID)
		}
		if b := spec.Base; b != nil {
			if b.Tokens <= 0 || b.Tokens%model.KDAChunk != 0 || len(b.Layers) != c.NumLayers {
				return nil, fmt.Errorf("scheduler: job %s: a base state of %d tokens and %d layers; want a multiple of %d tokens and the model's %d layers",
					spec.ID, b.Tokens, len(b.Layers), model.KDAChunk, c.NumLayers)
			}
			for L, ls := range b.Layers {
				if err := c.CheckLayerState(ls, L, b.Tokens, s.cfg.Exec.Model.State.LatentDType); err != nil {
					return nil, fmt.Errorf("scheduler: job %s: base %w", spec.ID, err)
				}
			}
		}
		for i, id := range spec.Tokens {
			if id < 0 || int(id) >= c.VocabSize {
				return nil, fmt.Errorf("scheduler: job %s: token id %d at position %d is outside the vocabulary [0, %d)", spec.ID, id, i, c.VocabSize)
			}
		}
		if err := s.cfg.Exec.Model.CheckMedia(spec.Media, len(spec.Tokens)); err != nil {
			return nil, fmt.Errorf("scheduler: job %s: %w", spec.ID, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, ErrStopped
	}
	for _, spec := range specs {
		if _, dup := s.jobs[spec.ID]; dup {
			return nil, fmt.Errorf("scheduler: job %s is already queued or running", spec.ID)
		}
	}
	out := make([]*Job, len(specs))
	for i, spec := range specs {
		j := &Job{spec: spec, submitted: time.Now(), finish: make(chan struct{})}
		if spec.Base != nil {
			j.baseTokens = spec.Base.Tokens
		}
		j.ctx, j.cancel = context.WithCancelCause(context.Background())
		if !spec.Deadline.IsZero() {
			var cancel context.CancelFunc
			j.ctx, cancel = context.WithDeadlineCause(j.ctx, spec.Deadline, fmt.Errorf("job %s: deadline %s passed", spec.ID, spec.Deadline.Format(time.RFC3339)))
			go func() { <-j.finish; cancel() }()
		}
		s.jobs[spec.ID] = j
		out[i] = j
		if len(spec.Tokens) == 0 {
			go s.finishEmpty(j)
			continue
		}
		if spec.Encode != nil {
			if s.cfg.SerialEncode {
				s.encoding = append(s.encoding, j)
			} else {
				go s.encode(j)
			}
			continue
		}
		s.waiting = append(s.waiting, j)
	}
	s.stats.Queued = len(s.waiting)
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return out, nil
}

// encode runs a job's Encode and queues the job with its media, or
// fails it; a job cancelled meanwhile is left as Cancel settled it.
func (s *Scheduler) encode(j *Job) {
	t0 := time.Now()
	media, err := j.spec.Encode(j.ctx)
	if err == nil {
		err = s.cfg.Exec.Model.CheckMedia(media, len(j.spec.Tokens))
	}
	if err != nil {
		if j.ctx.Err() != nil {
			err = context.Cause(j.ctx) // cancelled, or past its deadline
		}
		s.finish(j, fmt.Errorf("job %s: image features: %w", j.spec.ID, err)) // once: a Cancel may have settled it
		return
	}
	s.log.Info("image features ready", zap.String("job", j.spec.ID), zap.Int("images", len(media)), zap.Duration("took", time.Since(t0).Round(time.Millisecond)))
	s.mu.Lock()
	if j.finished() || s.stopped {
		s.mu.Unlock()
		return
	}
	j.spec.Media = media
	s.waiting = append(s.waiting, j)
	s.stats.Queued = len(s.waiting)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// finishEmpty serves a job with nothing to prefill (a prompt of one token,
// or one whose prefix state is its Base whole): the sink gets every
// layer's state, empty or the base's, and the job is done.
func (s *Scheduler) finishEmpty(j *Job) {
	c := s.cfg.Exec.Model.Cfg
	ctx, cancel := context.WithTimeout(j.ctx, s.cfg.CloseTimeout)
	defer cancel()
	var err error
	for L := 0; L < c.NumLayers && err == nil; L++ {
		ls := c.NewLayerState(L, s.cfg.Exec.Model.State)
		if j.spec.Base != nil {
			ls = j.spec.Base.Layers[L]
		}
		err = j.spec.Sink.PutLayer(ctx, ls)
	}
	if err == nil {
		err = j.spec.Sink.Close(ctx, j.base())
	}
	if err != nil {
		err = fmt.Errorf("job %s: %w", j.spec.ID, err)
	}
	s.finish(j, err)
}

// Cancel cancels a job wherever it is: a waiting job finishes at once, a
// job in a pass is dropped at the next layer boundary. It reports whether
// the job was known and not yet finished.
func (s *Scheduler) Cancel(id string) bool {
	s.mu.Lock()
	j, ok := s.jobs[id]
	if ok {
		for i, w := range s.waiting {
			if w == j {
				s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
				break
			}
		}
	}
	s.mu.Unlock()
	if !ok || j.finished() {
		return false
	}
	err := fmt.Errorf("job %s: %w", id, ErrCancelled)
	j.cancel(err)
	s.mu.Lock()
	inProgress := false
	for _, p := range s.progress {
		inProgress = inProgress || p == j
	}
	s.mu.Unlock()
	if !inProgress {
		s.finish(j, err)
	} else {
		select { // a loop waiting for memory re-plans without the job
		case s.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// finish ends a job, once: the books first, then the job's waiters, so
// that Stats counts a job as soon as its Wait returns.
func (s *Scheduler) finish(j *Job, err error) {
	j.once.Do(func() {
		j.state = nil // callers may keep the handle; the state must not stay with it
		s.mu.Lock()
		delete(s.jobs, j.spec.ID)
		for i, p := range s.progress {
			if p == j {
				s.progress = append(s.progress[:i], s.progress[i+1:]...)
				break
			}
		}
		for i, w := range s.waiting {
			if w == j {
				s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
				break
			}
		}
		switch {
		case err == nil:
			s.stats.Completed++
		case errors.Is(err, ErrCancelled) || errors.Is(err, context.Canceled):
			s.stats.Cancelled++
		default:
			s.stats.Failed++
		}
		s.stats.Queued, s.stats.InProgress = len(s.waiting), len(s.progress)
		select { // a settled job frees memory a waiting pass may need
		case s.wake <- struct{}{}:
		default:
		}
		s.mu.Unlock()
		j.settle(err)
		if err != nil {
			s.log.Info("job failed", zap.String("job", j.spec.ID), zap.Error(err))
		} else {
			s.log.Info("job done", zap.String("job", j.spec.ID), zap.Int("tokens", len(j.spec.Tokens)),
				zap.Int("passes", j.passes), zap.Duration("prefill", j.result.Prefill.Round(time.Millisecond)))
		}
	})
}

// Stats returns a snapshot of the counters.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Queued, st.InProgress = len(s.waiting), len(s.progress)
	return st
}

// Plan is what the next pass would do with the queue as it is now (or with
// the given jobs, when jobs is not nil), without running it.
func (s *Scheduler) Plan(jobs []planner.Job) (planner.Plan, error) {
	var draining int64
	if jobs == nil {
		jobs, _, draining = s.snapshot()
	}
	return planner.Make(s.input(jobs, draining))
}

func (s *Scheduler) input(jobs []planner.Job, draining int64) planner.Input {
	return planner.Input{Costs: s.cfg.Costs, Budget: s.cfg.Budget, Depth: s.cfg.Depth, MaxTile: s.cfg.MaxTile, Jobs: jobs, Draining: draining}
}

// snapshot lists the jobs a pass could take, in progress first, as the
// planner wants them, and the memory still held by committing jobs' sink
// queues. Cancelled jobs are finished on the way.
func (s *Scheduler) snapshot() ([]planner.Job, []*Job, int64) {
	s.mu.Lock()
	all := append(append([]*Job(nil), s.progress...), s.waiting...)
	s.mu.Unlock()
	var pj []planner.Job
	var js []*Job
	var draining int64
	for _, j := range all {
		if j.committing {
			draining += int64(s.cfg.SinkQueue+1) * s.cfg.Costs.LayerState(len(j.spec.Tokens))
			continue
		}
		if j.ctx.Err() != nil {
			s.finish(j, context.Cause(j.ctx))
			continue
		}
		pj = append(pj, planner.Job{ID: j.spec.ID, Total: len(j.spec.Tokens), Done: j.done})
		js = append(js, j)
	}
	return pj, js, draining
}

// Run runs passes until ctx ends; then it fails every unfinished job with
// the context's error and returns it.
func (s *Scheduler) Run(ctx context.Context) error {
	defer s.stop(ctx)
	for pass := 1; ; {
		s.mu.Lock()
		enc := s.encoding
		s.encoding = nil
		s.mu.Unlock()
		for _, j := range enc {
			s.encode(j) // a cancelled job's Encode returns at once
		}
		pj, js, draining := s.snapshot()
		if len(js) == 0 {
			select {
			case <-s.wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		st := Next(s.input(pj, draining))
		for _, d := range st.Drops {
			s.finish(js[d.Job], d.Err)
		}
		if !st.Run {
			if !st.Wait {
				continue
			}
			// Finished jobs' states are still draining to their sinks: wait
			// for one to commit.
			select {
			case <-s.wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		plan := st.Plan
		s.runPass(ctx, pass, plan, js)
		pass++
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (s *Scheduler) stop(ctx context.Context) {
	s.mu.Lock()
	s.stopped = true
	all := make([]*Job, 0, len(s.jobs))
	for _, j := range s.jobs {
		all = append(all, j)
	}
	s.mu.Unlock()
	err := fmt.Errorf("prefill worker stopping: %w", context.Cause(ctx))
	for _, j := range all {
		s.finish(j, fmt.Errorf("job %s: %w", j.spec.ID, err))
	}
}

// runPass runs one planned pass and settles its jobs.
func (s *Scheduler) runPass(ctx context.Context, pass int, plan planner.Plan, js []*Job) {
	c := s.cfg.Exec.Model.Cfg
	s.log.Info("pass plan", zap.Int("pass", pass), zap.String("plan", plan.String()))
	seqs := make([]*executor.Seq, len(plan.Pieces))
	jobs := make([]*Job, len(plan.Pieces))
	now := time.Now()
	s.mu.Lock()
	for i, pc := range plan.Pieces {
		j := js[pc.Job]
		if j.state == nil {
			if b := j.spec.Base; b != nil {
				j.state = b // continued: the executor appends the job's rows to its own
			} else {
				j.state = c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: s.cfg.Exec.Model.State.LatentDType, LatentCapacity: len(j.spec.Tokens)})
			}
			j.out = sink.NewQueue(j.spec.Sink, s.cfg.SinkQueue)
			j.started = now
			for k, w := range s.waiting {
				if w == j {
					s.waiting = append(s.waiting[:k], s.waiting[k+1:]...)
					break
				}
			}
			s.progress = append(s.progress, j)
		}
		j.passes++
		jobs[i] = j
		seqs[i] = &executor.Seq{ID: j.spec.ID, Ctx: j.ctx, State: j.state, Tokens: j.spec.Tokens[pc.Lo:pc.Hi],
			Media: model.MediaWindow(j.spec.Media, pc.Lo, pc.Hi, c.HiddenSize), Final: pc.Final, Out: j.out}
	}
	s.stats.Queued, s.stats.InProgress = len(s.waiting), len(s.progress)
	s.mu.Unlock()

	progress := func(p executor.Progress) {
		if s.cfg.OnLayer != nil {
			s.cfg.OnLayer(p)
		}
		for i, sq := range seqs {
			if f := jobs[i].spec.Progress; f != nil && sq.Err == nil {
				pc := plan.Pieces[i]
				f(Progress{Job: sq.ID, Pass: pass, Layer: p.Layer, Layers: p.Layers, Done: pc.Lo, InPass: pc.Len(), Total: len(jobs[i].spec.Tokens), Cached: jobs[i].baseTokens,
					ReadGBps: p.ReadGBps, Elapsed: p.Elapsed, ETA: p.ETA, Final: pc.Final})
			}
		}
	}
	st, err := s.cfg.Exec.Run(ctx, seqs, executor.Options{Depth: plan.Depth, Tile: plan.Tile, Pass: pass,
		SinkTimeout: s.cfg.SinkTimeout, Progress: progress})
	if err != nil {
		s.log.Error("pass failed", zap.Int("pass", pass), zap.Error(err))
	}
	rep := PassReport{Pass: pass, Plan: plan, Stats: st, Err: err}
	s.mu.Lock()
	s.stats.Passes++
	s.stats.TokensPrefilled += int64(st.Tokens)
	s.stats.BytesRead += st.Bytes
	s.stats.ComputeTime += st.Compute
	s.stats.PassTime += st.Wall
	s.stats.ReadWait += st.ReadWait
	s.stats.LastPass = &rep
	s.mu.Unlock()
	s.log.Info("pass done", zap.Int("pass", pass), zap.Int("tokens", st.Tokens), zap.Int("layers", st.Layers),
		zap.Float64("read_gb", float64(st.Bytes)/1e9), zap.Duration("wall", st.Wall.Round(time.Millisecond)),
		zap.Duration("compute", st.Compute.Round(time.Millisecond)), zap.Duration("read_wait", st.ReadWait.Round(time.Millisecond)))
	if s.cfg.OnPass != nil {
		s.cfg.OnPass(rep)
	}
	// Settle the jobs after OnPass: a job never finishes before its pass is
	// reported.
	for i, sq := range seqs {
		j := jobs[i]
		switch {
		case sq.Err != nil:
			cause := sq.Err
			if c := context.Cause(j.ctx); c != nil && errors.Is(sq.Err, context.Canceled) {
				cause = fmt.Errorf("%w (%w)", sq.Err, c)
			}
			s.finish(j, cause)
		case err != nil:
			s.finish(j, fmt.Errorf("job %s: %w", j.spec.ID, err))
		default:
			j.done += len(sq.Tokens)
			if sq.Final {
				j.state = nil // every layer went to the sink
				j.committing = true
				go s.commit(j)
			}
		}
	}
}

// commit waits for the sink to take the last layers and commit the state.
func (s *Scheduler) commit(j *Job) {
	ctx, cancel := context.WithTimeout(j.ctx, s.cfg.CloseTimeout)
	defer cancel()
	err := j.out.Close(ctx, j.base()+len(j.spec.Tokens))
	if err != nil {
		err = fmt.Errorf("job %s: committing the state: %w", j.spec.ID, err)
	}
	s.finish(j, err)
}
