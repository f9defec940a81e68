package pipeline

import (
	"time"

	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/model"
)

// timeAttention has a prefill step's batch time each sequence's MLA
// attention (model.Batch.Attention).
func timeAttention(b *model.Batch, phase model.Phase) {
	if phase == model.PhasePrefill {
		b.Attention = map[*model.SeqState]time.Duration{}
	}
}

// addAttention adds this rank's attention times of the step's sequences
// ss to the step's trace and to the rank's counters.
func (w *Worker) addAttention(tr *mesh.Trace, b *model.Batch, ss []*seq) {
	for _, s := range ss {
		if d := b.Attention[s.e.State]; d > 0 {
			w.counters.prefillAttention += d
			if tr.Attn == nil {
				tr.Attn = map[string]int64{}
			}
			tr.Attn[s.id] += int64(d)
		}
	}
}
