package model

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// LocalReducers returns the Reducers of n tensor ranks that run in one
// process (tests): each call waits for all n ranks
// and sums their buffers in rank order in float64, rounded once, the sum
// collective.Group computes over links. A rank whose ctx ends while it
// waits breaks the group, and so does Close: every waiting and later call
// fails. A rank that fails outside a reduction closes its reducer, as a
// process that dies closes its links, so that the others do not wait.
func LocalReducers(n int) []*LocalReducer {
	g := &localGroup{n: n, bufs: make([][]float32, n), cur: newLocalCall()}
	out := make([]*LocalReducer, n)
	for r := range out {
		out[r] = &LocalReducer{g, r}
	}
	return out
}

type localGroup struct {
	mu      sync.Mutex
	n       int
	bufs    [][]float32
	arrived int
	cur     *localCall
	broken  error
	sum     []float64
}

// localCall is one reduction: done closes when it ends, err says how.
type localCall struct {
	done chan struct{}
	err  error
}

func newLocalCall() *localCall { return &localCall{done: make(chan struct{})} }

// LocalReducer is one rank's Reducer of LocalReducers.
type LocalReducer struct {
	g    *localGroup
	rank int
}

// Close breaks the group: the other ranks' waiting and later calls fail.
func (r *LocalReducer) Close() error {
	r.g.mu.Lock()
	defer r.g.mu.Unlock()
	if r.g.broken == nil {
		r.g.breakLocked(fmt.Errorf("local reduction: rank %d left the group", r.rank))
	}
	return nil
}

// AllReduce sums buf over the ranks in rank order.
func (r *LocalReducer) AllReduce(ctx context.Context, buf []float32) error {
	g := r.g
	g.mu.Lock()
	if g.broken != nil {
		g.mu.Unlock()
		return g.broken
	}
	call := g.cur
	if g.bufs[r.rank] != nil {
		g.breakLocked(fmt.Errorf("local reduction: rank %d called twice in one reduction", r.rank))
		g.mu.Unlock()
		return call.err
	}
	for _, b := range g.bufs {
		if b != nil && len(b) != len(buf) {
			g.breakLocked(fmt.Errorf("local reduction: rank %d has %d values, another rank %d", r.rank, len(buf), len(b)))
			g.mu.Unlock()
			return call.err
		}
	}
	g.bufs[r.rank] = buf
	if g.arrived++; g.arrived == g.n {
		g.finishLocked()
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
		g.mu.Lock()
		if g.cur == call && g.broken == nil {
			g.breakLocked(fmt.Errorf("local reduction: rank %d stopped waiting: %w", r.rank, context.Cause(ctx)))
		}
		g.mu.Unlock()
		<-call.done
		return call.err
	}
}

// finishLocked sums the arrived buffers in rank order into all of them.
func (g *localGroup) finishLocked() {
	n := len(g.bufs[0])
	if cap(g.sum) < n {
		g.sum = make([]float64, n)
	}
	s := g.sum[:n]
	for i, v := range g.bufs[0] {
		s[i] = float64(v)
	}
	for _, b := range g.bufs[1:] {
		for i, v := range b {
			s[i] += float64(v)
		}
	}
	for _, b := range g.bufs {
		for i := range b {
			b[i] = float32(s[i])
		}
	}
	clear(g.bufs)
	g.arrived = 0
	close(g.cur.done)
	g.cur = newLocalCall()
}

var errLocalBroken = errors.New("local reduction group is broken")

// breakLocked fails the current call and every later one.
func (g *localGroup) breakLocked(err error) {
	g.broken = fmt.Errorf("%w: %w", errLocalBroken, err)
	g.cur.err = g.broken
	close(g.cur.done)
}
