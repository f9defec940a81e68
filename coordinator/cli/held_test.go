package cli

import (
	"strings"
	"sync"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// heldPrefill is the prefill worker's CPU backend, holding every pass
// before it binds the weights of one layer while a hold is on: the layers
// before it are reported done while the job waits there, whatever the
// machine's speed.
type heldPrefill struct {
	kernels.Backend
	prefix string
	mu     sync.Mutex
	gate   chan struct{} // closed: no hold
}

// newHeldPrefill holds passes at layer, from the start when held.
func newHeldPrefill(threads, layer int, held bool) *heldPrefill {
	h := &heldPrefill{Backend: cpu.New(threads), prefix: model.LayerPrefix(layer), gate: make(chan struct{})}
	if !held {
		close(h.gate)
	}
	return h
}

func (h *heldPrefill) Bind(m *kernels.Matrix) error {
	if strings.HasPrefix(m.Name, h.prefix) {
		h.mu.Lock()
		gate := h.gate
		h.mu.Unlock()
		<-gate
	}
	return h.Backend.Bind(m)
}

// Hold holds the passes that reach the layer from now on.
func (h *heldPrefill) Hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.gate:
		h.gate = make(chan struct{})
	default:
	}
}

// Resume lets the held passes go on, and the next ones pass.
func (h *heldPrefill) Resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.gate:
	default:
		close(h.gate)
	}
}
