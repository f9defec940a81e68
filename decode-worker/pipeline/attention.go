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

// account adds a prefill step's compute, summed over the ranks and shared
// out by rows, and its attention times to its sequences' timings.
func (f *flight) account(tr mesh.Trace) {
	var compute time.Duration
	for _, v := range tr.Compute {
		compute += time.Duration(v)
	}
	total := 0
	for _, n := range f.rows {
		total += n
	}
	for i, s := range f.seqs {
		if f.rows[i] > 0 {
			s.timing.PrefillSteps++
		}
		if total > 0 {
			s.timing.PrefillCompute += time.Duration(float64(compute) * float64(f.rows[i]) / float64(total))
		}
		s.timing.PrefillAttention += time.Duration(tr.Attn[s.id])
	}
}
