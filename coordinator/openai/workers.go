package openai

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// workerView follows the worker registry to know whether any decode rank
// serves the model, so that a request with nobody to run it gets 503 at
// once instead of waiting in the queue for the placement timeout. A front
// door that cannot read the registry (a client identity may not: it is
// the coordinators' and workers') does not know, and leaves the answer to
// the coordinator, which fails a job it cannot place as unavailable.
type workerView struct {
	nc     *nats.Conn
	bucket string
	model  string
	log    *zap.Logger

	mu     sync.Mutex
	synced bool
	decode map[string]bool // live, non-draining decode ranks of the model
}

func newWorkerView(nc *nats.Conn, bucket, model string, log *zap.Logger) *workerView {
	return &workerView{nc: nc, bucket: bucket, model: model, log: log, decode: map[string]bool{}}
}

// count is the number of decode ranks serving the model; known is false
// until the registry has been read.
func (v *workerView) count() (n int, known bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.decode), v.synced
}

// run binds the registry (retrying until a coordinator created it) and
// follows it until ctx ends.
func (v *workerView) run(ctx context.Context) {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		if err := v.watch(ctx); err != nil && ctx.Err() == nil {
			v.log.Debug("worker registry not watched yet", zap.Error(err))
		}
		v.mu.Lock()
		v.decode, v.synced = map[string]bool{}, false
		v.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (v *workerView) watch(ctx context.Context) error {
	reg, err := cp.BindRegistry(ctx, v.nc, v.bucket)
	if err != nil {
		return err
	}
	ch, err := reg.Watch(ctx)
	if err != nil {
		return err
	}
	for c := range ch {
		v.mu.Lock()
		switch c.Op {
		case cp.WorkerUp:
			w := c.Info
			if w.Kind == cp.KindDecode && (w.Model == "" || w.Model == v.model) && !w.Draining {
				v.decode[w.ID] = true
			} else {
				delete(v.decode, w.ID)
			}
		case cp.WorkerLeft, cp.WorkerExpired:
			delete(v.decode, c.ID)
		case cp.WorkerSynced:
			v.synced = true
		}
		v.mu.Unlock()
	}
	return ctx.Err()
}
