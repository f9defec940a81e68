package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tandem-inference/tandem/model"
)

// Memory is a LayerSink that keeps the state in memory and checks the
// hand-over contract: every layer once, in order, then Close.
type Memory struct {
	mu      sync.Mutex
	state   model.SeqState
	last    int // last layer received, -1 before the first
	closed  bool
	aborted error
}

// NewMemory returns a sink for a model of layers layers.
func NewMemory(layers int) *Memory {
	return &Memory{state: model.SeqState{Layers: make([]*model.LayerState, layers)}, last: -1}
}

func (m *Memory) PutLayer(ctx context.Context, ls *model.LayerState) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.aborted != nil:
		return fmt.Errorf("memory sink: aborted: %w", m.aborted)
	case m.closed:
		return fmt.Errorf("memory sink: layer %d after Close", ls.Layer)
	case ls.Layer <= m.last || ls.Layer >= len(m.state.Layers):
		return fmt.Errorf("memory sink: layer %d after layer %d (want increasing layers below %d)", ls.Layer, m.last, len(m.state.Layers))
	}
	m.state.Layers[ls.Layer] = ls
	m.last = ls.Layer
	return nil
}

func (m *Memory) Close(ctx context.Context, tokens int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.aborted != nil {
		return fmt.Errorf("memory sink: aborted: %w", m.aborted)
	}
	m.closed = true
	m.state.Tokens = tokens
	return nil
}

func (m *Memory) Abort(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.aborted == nil {
		m.aborted = err
	}
}

// ErrNotClosed is returned by State before Close.
var ErrNotClosed = errors.New("memory sink: not closed")

// State returns the received state once closed, or the abort error.
func (m *Memory) State() (*model.SeqState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.aborted != nil {
		return nil, m.aborted
	}
	if !m.closed {
		return nil, ErrNotClosed
	}
	return &m.state, nil
}

// Aborted reports the error the sink was aborted with, if any.
func (m *Memory) Aborted() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.aborted
}
