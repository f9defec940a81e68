package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tandem-inference/tandem/model"
)

// Queue hands one sequence's layer states to a sink through a bounded queue
// drained by its own goroutine. A pass enqueues and moves on; it waits only
// when the queue is full, so a slow sink slows the pass (backpressure)
// instead of growing memory. A queue is used by one pass goroutine.
type Queue struct {
	sink   model.LayerSink
	ch     chan *model.LayerState
	done   chan struct{} // closed when the drainer exits
	failed chan struct{} // closed when the sink failed
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	err     error
	closed  bool // ch closed
	aborted sync.Once
}

// ErrAborted is the error of puts to an aborted queue.
var ErrAborted = errors.New("sink queue aborted")

// NewQueue starts a queue of up to depth layer states in front of s.
func NewQueue(s model.LayerSink, depth int) *Queue {
	q := &Queue{sink: s, ch: make(chan *model.LayerState, max(depth, 1)), done: make(chan struct{}), failed: make(chan struct{})}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	go q.drain()
	return q
}

func (q *Queue) drain() {
	defer close(q.done)
	for {
		select {
		case ls, ok := <-q.ch:
			if !ok {
				return
			}
			if err := q.sink.PutLayer(q.ctx, ls); err != nil {
				q.setErr(fmt.Errorf("sink refused layer %d: %w", ls.Layer, err))
				q.cancel()
				return // the pass sees the error on its next put; queued states are dropped
			}
		case <-q.ctx.Done():
			return
		}
	}
}

func (q *Queue) setErr(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err == nil {
		q.err = err
		close(q.failed)
	}
}

// Err is the sink's failure, if any.
func (q *Queue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Put enqueues a layer's state; ownership passes to the sink. It blocks
// while the queue is full, until ctx ends (the caller's timeout for a stuck
// sink) or the sink fails.
func (q *Queue) Put(ctx context.Context, ls *model.LayerState) error {
	if err := q.Err(); err != nil {
		return err
	}
	select {
	case q.ch <- ls:
		return nil
	default:
	}
	select {
	case q.ch <- ls:
		return nil
	case <-q.failed:
		return q.Err()
	case <-ctx.Done():
		return fmt.Errorf("sink queue full (%d layers waiting) at layer %d: %w", cap(q.ch), ls.Layer, context.Cause(ctx))
	}
}

// Len is the number of states waiting.
func (q *Queue) Len() int { return len(q.ch) }

// Close waits until every queued state is with the sink, then closes the
// sink for a sequence of tokens tokens (which waits for the far side's
// commit), all within ctx. Nothing may be put afterwards.
func (q *Queue) Close(ctx context.Context, tokens int) error {
	q.closeCh()
	select {
	case <-q.done:
	case <-ctx.Done():
		return fmt.Errorf("sink still draining: %w", context.Cause(ctx))
	}
	if err := q.Err(); err != nil {
		return err
	}
	return q.sink.Close(ctx, tokens)
}

// Abort drops whatever is queued, interrupts a put in progress and aborts
// the sink with err (once; later calls do nothing). It is safe to call from
// any goroutine, and it does not wait for the sink.
func (q *Queue) Abort(err error) {
	q.aborted.Do(func() {
		q.setErr(fmt.Errorf("%w: %w", ErrAborted, err))
		q.cancel()
		q.sink.Abort(err)
	})
}

func (q *Queue) closeCh() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.ch)
	}
}
