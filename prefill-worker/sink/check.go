package sink

import (
	"context"
	"fmt"
	"sync"

	"github.com/tandem-inference/tandem/model"
)

// Check is a LayerSink that checks every layer's state and keeps only its
// size: the parts, dtypes and shapes the config implies for a sequence of
// the expected length, every value finite (model.Config.CheckLayerState),
// every layer once and in order, then Close with that length. It takes the
// states of passes whose states need not be kept, such as a full-size
// model's pass on a machine that only proves the pass runs.
type Check struct {
	cfg    *model.Config
	tokens int
	latent model.DType

	mu      sync.Mutex
	sizes   []int // bytes of each layer's state, -1 until received
	last    int
	err     error
	closed  bool
	aborted error
}

// NewCheck returns a sink for a sequence of tokens cached tokens of cfg's
// model, with MLA cache rows of dtype latent.
func NewCheck(cfg *model.Config, tokens int, latent model.DType) *Check {
	c := &Check{cfg: cfg, tokens: tokens, latent: latent, sizes: make([]int, cfg.NumLayers), last: -1}
	for i := range c.sizes {
		c.sizes[i] = -1
	}
	return c
}

func (c *Check) PutLayer(ctx context.Context, ls *model.LayerState) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.aborted != nil:
		return fmt.Errorf("check sink: aborted: %w", c.aborted)
	case c.err != nil:
		return c.err
	case c.closed:
		return fmt.Errorf("check sink: layer %d after Close", ls.Layer)
	case ls.Layer <= c.last || ls.Layer >= len(c.sizes):
		c.err = fmt.Errorf("check sink: layer %d after layer %d (want increasing layers below %d)", ls.Layer, c.last, len(c.sizes))
		return c.err
	}
	if err := c.cfg.CheckLayerState(ls, ls.Layer, c.tokens, c.latent); err != nil {
		c.err = fmt.Errorf("check sink: %w", err)
		return c.err
	}
	c.sizes[ls.Layer] = ls.Bytes()
	c.last = ls.Layer
	return nil // the state is dropped here
}

func (c *Check) Close(ctx context.Context, tokens int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.aborted != nil:
		return fmt.Errorf("check sink: aborted: %w", c.aborted)
	case c.err != nil:
		return c.err
	case tokens != c.tokens:
		c.err = fmt.Errorf("check sink: closed with %d tokens, expected %d", tokens, c.tokens)
		return c.err
	case c.last != len(c.sizes)-1:
		c.err = fmt.Errorf("check sink: closed after layer %d of %d", c.last, len(c.sizes))
		return c.err
	}
	c.closed = true
	return nil
}

func (c *Check) Abort(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted == nil {
		c.aborted = err
	}
}

// Sizes returns each layer's state size in bytes once the sink is closed
// with every layer checked, or the reason it is not.
func (c *Check) Sizes() ([]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.aborted != nil:
		return nil, c.aborted
	case c.err != nil:
		return nil, c.err
	case !c.closed:
		return nil, ErrNotClosed
	}
	return append([]int(nil), c.sizes...), nil
}
