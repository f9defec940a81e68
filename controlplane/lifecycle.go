package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Lifecycle is a worker's part of the drain protocol, shared by both
// workers' adapters: whether it takes jobs yet or still, the jobs it has
// taken, and its way out, a drain then Close. A drain is asked by a
// coordinator's DrainRequest or by the process. A worker serves its
// subjects before it registers and takes jobs only once Registered, so that
// a coordinator that finds it in the registry finds it serving and an
// assignment meant for a restarted worker's old process is refused.
type Lifecycle struct {
	id, what string         // the worker's id, and what it is ("prefill worker")
	running  func() int     // the jobs it holds, for the log and DrainReply
	log      *zap.Logger    // already names the worker
	jobs     sync.WaitGroup // jobs admitted and not done

	mu         sync.Mutex
	beat       func() // sends a heartbeat now; nil until registered
	registered bool
	closing    bool
	draining   bool
	drained    chan struct{} // closed when a drain starts
}

// NewLifecycle makes the lifecycle of worker id (what names it in
// replies: "prefill worker", "decode rank"); running counts the jobs it
// holds. It takes no job until Registered.
func NewLifecycle(id, what string, running func() int, log *zap.Logger) *Lifecycle {
	return &Lifecycle{id: id, what: what, running: running, log: log, drained: make(chan struct{})}
}

// Registered says that the registry shows the worker: it takes jobs from
// now on (unless it is leaving), and beat sends a heartbeat at once (so
// that routers learn of a drain or a dropped cache entry without waiting
// for the next beat).
func (l *Lifecycle) Registered(beat func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.beat, l.registered = beat, true
}

// Beat sends a heartbeat now, once the worker has registered (before, its
// first heartbeat is still to come and will carry the news).
func (l *Lifecycle) Beat() {
	l.mu.Lock()
	beat := l.beat
	l.mu.Unlock()
	if beat != nil {
		beat()
	}
}

// Admit counts a job in unless the worker is leaving; then it says why,
// and the assignment is to be refused unavailable, so that the coordinator
// places the job elsewhere. An admitted job ends with Done. Checked and
// counted under one lock, a job is either admitted before a drain starts
// (and the drain waits for it) or refused.
func (l *Lifecycle) Admit() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.notReadyLocked(); err != nil {
		return err
	}
	l.jobs.Add(1)
	return nil
}

// Done ends a job Admit counted in.
func (l *Lifecycle) Done() { l.jobs.Done() }

// Leaving reports whether the worker takes no new jobs (draining or
// closing): its heartbeat says draining.
func (l *Lifecycle) Leaving() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closing || l.draining
}

// NotReady says why the worker takes no jobs now (nil: it takes them).
func (l *Lifecycle) NotReady() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.notReadyLocked()
}

func (l *Lifecycle) notReadyLocked() error {
	switch {
	case l.closing:
		return errors.New("shutting down")
	case l.draining:
		return errors.New("draining: it takes no new jobs")
	case !l.registered:
		return errors.New("starting: not registered yet")
	}
	return nil
}

// Draining is closed once a drain has started (StartDrain, or a
// coordinator's DrainRequest): the process should drain and exit.
func (l *Lifecycle) Draining() <-chan struct{} { return l.drained }

// StartDrain marks the worker draining (once, logged with reason) and
// beats at once, so that the registry shows it draining; it returns the
// jobs the worker holds.
func (l *Lifecycle) StartDrain(reason string) int {
	n := l.running()
	l.mu.Lock()
	if !l.draining {
		l.draining = true
		close(l.drained)
		l.log.Info("draining: no new jobs", zap.Int("running", n), zap.String("reason", reason))
	}
	l.mu.Unlock()
	l.Beat()
	return n
}

// Close marks the worker closing: it takes no job from now on.
func (l *Lifecycle) Close() {
	l.mu.Lock()
	l.closing = true
	l.mu.Unlock()
}

// Wait waits until every admitted job is done, or ctx ends.
func (l *Lifecycle) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { l.jobs.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DrainRequest answers a coordinator's DrainRequest (Serve it on
// WorkerDrain): the worker starts draining and replies with the jobs it
// still holds.
func (l *Lifecycle) DrainRequest(_ context.Context, req *DrainRequest) (*DrainReply, error) {
	rep := &DrainReply{WorkerID: l.id}
	if req.WorkerID != l.id {
		rep.SetError(CodeBadRequest, fmt.Sprintf("%s %s: the drain request is addressed to %s", l.what, l.id, req.WorkerID))
		return rep, nil
	}
	rep.Running = l.StartDrain(req.Reason)
	return rep, nil
}

// Leaver is a worker's control-plane adapter as its process leaves.
type Leaver interface {
	// Draining is closed when a coordinator asked the worker to drain.
	Draining() <-chan struct{}
	// Drain stops taking jobs and waits for those running, or ctx.
	Drain(ctx context.Context) error
	// Close cancels what is left and deregisters the worker.
	Close(ctx context.Context) error
}

// Leave is a worker process's bounded way out: it waits until ctx ends
// (SIGTERM) or a coordinator asks w to drain, lets the running jobs finish
// for at most drainGrace (no new ones are taken), then closes w within
// shutdownGrace, whether or not NATS is still there.
func Leave(ctx context.Context, w Leaver, drainGrace, shutdownGrace time.Duration, log *zap.Logger) {
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining", zap.Duration("drain_grace", drainGrace))
	case <-w.Draining():
		log.Info("drain requested: draining, then exiting", zap.Duration("drain_grace", drainGrace))
	}
	dctx, cancelDrain := context.WithTimeout(context.Background(), drainGrace)
	if err := w.Drain(dctx); err != nil {
		log.Warn("drain grace over: cancelling what is left", zap.Error(err))
	}
	cancelDrain()
	cctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := w.Close(cctx); err != nil {
		log.Warn("control plane: leaving", zap.Error(err))
		return
	}
	log.Info("left the control plane: deregistered")
}
