package group

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
)

// Collector is a pipeline.Sink that keeps every sequence's tokens and end,
// for tests and the bench.
type Collector struct {
	mu   sync.Mutex
	seqs map[string]*collected
}

type collected struct {
	tokens []int32
	res    pipeline.Result
	done   chan struct{}
	bad    error // tokens out of order
}

// NewCollector returns an empty collector.
func NewCollector() *Collector { return &Collector{seqs: map[string]*collected{}} }

func (c *Collector) get(id string) *collected {
	s := c.seqs[id]
	if s == nil {
		s = &collected{done: make(chan struct{})}
		c.seqs[id] = s
	}
	return s
}

// Token records a token; indexes must come in order.
func (c *Collector) Token(seq string, index int, token int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.get(seq)
	if index != len(s.tokens) && s.bad == nil {
		s.bad = fmt.Errorf("sequence %q: token index %d after %d tokens", seq, index, len(s.tokens))
	}
	s.tokens = append(s.tokens, token)
}

// End records the end.
func (c *Collector) End(seq string, r pipeline.Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.get(seq)
	select {
	case <-s.done:
		if s.bad == nil {
			s.bad = fmt.Errorf("sequence %q ended twice", seq)
		}
	default:
		s.res = r
		close(s.done)
	}
}

// Tokens returns the tokens received so far.
func (c *Collector) Tokens(seq string) []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.get(seq).tokens)
}

// Wait waits for the sequence's end and returns its tokens and result; the
// error is ctx's, or a sink contract violation (tokens out of order, two
// ends).
func (c *Collector) Wait(ctx context.Context, seq string) ([]int32, pipeline.Result, error) {
	c.mu.Lock()
	s := c.get(seq)
	c.mu.Unlock()
	select {
	case <-s.done:
	case <-ctx.Done():
		return c.Tokens(seq), pipeline.Result{}, fmt.Errorf("sequence %q: %w", seq, ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(s.tokens) != s.res.Tokens && s.bad == nil {
		s.bad = fmt.Errorf("sequence %q: %d tokens received, the end says %d", seq, len(s.tokens), s.res.Tokens)
	}
	return slices.Clone(s.tokens), s.res, s.bad
}

// Done reports whether the sequence has ended.
func (c *Collector) Done(seq string) bool {
	c.mu.Lock()
	s := c.get(seq)
	c.mu.Unlock()
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}
