package pipeline

import (
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// A cancellation takes effect inside a step. A rank computes a step on its
// loop, and a long prompt's prefill step can take seconds per layer, so the
// loop cannot wait for it to hear of a Cancel. Instead the sequences being
// cancelled are a set shared with whoever learns of a cancellation first:
// Cancel on the head, and on the other ranks the ring's reader, which sees
// the head's Cancel message as it arrives (mesh.Config.Early) and passes it
// on at once. A prefill step runs each layer in calls of bounded work
// (Config.CallFLOPs) and, between calls and before each layer, drops the
// cancelled sequences' rows with the step's partial work for them; the
// other sequences of the step go on, and the step travels on without them.
// A dropped sequence's state is torn (some layers ran the step, some did
// not): it is never stepped again; the Release that follows frees it.

// cancelSet is the sequences being cancelled.
type cancelSet struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

func (c *cancelSet) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ids == nil {
		c.ids = map[string]struct{}{}
	}
	c.ids[id] = struct{}{}
}

func (c *cancelSet) has(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.ids[id]
	return ok
}

func (c *cancelSet) remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ids, id)
}

// early is the ring reader's look at a message from the previous rank
// before the loop takes it: a Cancel marks its sequence at once and goes on
// to the next rank (the last rank's next is the head, which sent it). The
// loop takes the message afterwards, in order (onCancelMsg).
func (w *Worker) early(m *mesh.Msg) {
	if m.Kind != mesh.KindCancel || m.Seq == "" {
		return
	}
	w.cancels.add(m.Seq)
	if !w.ringLast {
		_ = w.ring.Send(&m.Header, nil)
	}
}

// onCancelMsg is the loop's turn at a Cancel message: a sequence this rank
// does not hold (it ended before the message came) is not to be dropped
// later. One it holds stays marked until its Release frees it.
func (w *Worker) onCancelMsg(m *mesh.Msg) {
	if s := w.seqs[m.Seq]; s == nil {
		w.cancels.remove(m.Seq)
	}
}

// announceCancel marks a sequence as being cancelled on the head and tells
// the other ranks, from the caller's goroutine: the loop may be in the
// middle of a step.
func (w *Worker) announceCancel(id string) {
	w.cancels.add(id)
	if w.ring != nil {
		_ = w.ring.Send(&mesh.Header{Kind: mesh.KindCancel, Seq: id}, nil) // a link down resets the ring anyway
	}
}

// runLayers runs this rank's layers over a step's batch of the sequences
// named ids and reports which are still in it (all of them for a decode
// step, whose one row per sequence runs whole). A prefill step runs layer
// by layer in calls of at most Config.CallFLOPs by the cost model's count,
// dropping cancelled sequences before each layer and between calls.
func (w *Worker) runLayers(b *model.Batch, ids []string, phase model.Phase) ([]bool, error) {
	keep := make([]bool, len(ids))
	for i := range keep {
		keep[i] = true
	}
	if phase != model.PhasePrefill || w.split() {
		// A split stage's ranks cut the same rows in every reduction, so
		// none drops a sequence inside a step (tensor.go).
		return keep, w.m.ForwardLayers(w.ctx, w.lo, w.hi, b, phase)
	}
	live := make([]int, len(ids)) // the batch's sequences, as indices into ids
	for i := range live {
		live[i] = i
	}
	drop := func(L, from int, next *kernels.Tensor) int {
		for j := 0; j < len(live); {
			id := ids[live[j]]
			if !w.cancels.has(id) {
				j++
				continue
			}
			sp := b.Spans[j]
			from -= min(max(from-sp.Lo, 0), sp.Len())
			w.m.DropSeq(b, j, next)
			keep[live[j]] = false
			live = append(live[:j], live[j+1:]...)
			w.log.Info("cancelled sequence dropped from its step", zap.String("seq", id), zap.Int("layer", L))
		}
		return from
	}
	cfg := &w.m.Cfg.Config
	calls := model.Calls{Budget: w.cfg.CallFLOPs, Between: drop,
		Cost: func(L, lo, hi int) float64 { return costmodel.LayerFLOPs(cfg, L, lo, hi).Total() }}
	if f := w.onCall.Load(); f != nil {
		calls.After = *f
	}
	for L := w.lo; L < w.hi; L++ {
		drop(L, 0, nil)
		if len(live) == 0 {
			return keep, nil
		}
		l := w.m.Layers[L]
		if l == nil {
			return keep, fmt.Errorf("model: layer %d is not resident on this holder", L)
		}
		if _, err := w.m.RunLayerInCalls(w.ctx, l, b, phase, calls); err != nil {
			return keep, err
		}
	}
	return keep, nil
}

// onCallHook is a hook run after each call of a prefill step's layer
// (tests).
type onCallHook = atomic.Pointer[func(layer, lo, hi int)]
