// Package heldbackend is a test helper: a kernels.Backend that holds every
// pass before it binds the weights of one layer while a hold is on, so
// that a test can keep a job at a known layer (the layers before it
// reported done) whatever the machine's speed. Production code never
// imports it.
package heldbackend

import (
	"strings"
	"sync"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// Backend wraps a backend, holding binds of one layer's matrices.
type Backend struct {
	kernels.Backend
	prefix string
	mu     sync.Mutex
	gate   chan struct{} // closed: no hold
}

// New wraps b, holding passes at layer from the start when held.
func New(b kernels.Backend, layer int, held bool) *Backend {
	h := &Backend{Backend: b, prefix: model.LayerPrefix(layer), gate: make(chan struct{})}
	if !held {
		close(h.gate)
	}
	return h
}

// Bind waits while a hold is on when m belongs to the held layer.
func (h *Backend) Bind(m *kernels.Matrix) error {
	if strings.HasPrefix(m.Name, h.prefix) {
		h.mu.Lock()
		gate := h.gate
		h.mu.Unlock()
		<-gate
	}
	return h.Backend.Bind(m)
}

// Hold holds the passes that reach the layer from now on.
func (h *Backend) Hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.gate:
		h.gate = make(chan struct{})
	default:
	}
}

// Resume lets the held passes go on, and the next ones pass.
func (h *Backend) Resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.gate:
	default:
		close(h.gate)
	}
}
