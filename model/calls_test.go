package model_test

import (
	"context"
	"testing"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// TestRunLayerInCallsDropsASequence: every layer run in calls of at most
// two KDA chunks' rows, one sequence dropped in the middle of an MLA layer
// and another in the middle of a layer that starts an AttnRes block (its
// rows leave the new partial sum too): the remaining sequence's logits and
// state are bit-identical to prefilling it alone in one call per layer.
func TestRunLayerInCallsDropsASequence(t *testing.T) {
	m := loadModel(t, "tiny", 2, model.BF16)
	ctx := context.Background()
	n := m.Cfg.NumLayers
	a, b, d := testkit.Prompt(300, m.Cfg.VocabSize, 0), testkit.Prompt(200, m.Cfg.VocabSize, 0)[7:], testkit.Prompt(150, m.Cfg.VocabSize, 0)[3:]
	alone := m.NewState(0, n)
	want, err := m.Prefill(ctx, []*model.SeqState{alone}, [][]int32{b})
	if err != nil {
		t.Fatal(err)
	}
	mla, block := -1, -1
	for L := 1; L < n; L++ {
		if mla < 0 && m.Cfg.LayerKind(L) == model.MLA {
			mla = L
		}
		if block < 0 && m.Cfg.IsBlockStart(L) && L != mla {
			block = L
		}
	}
	if mla < 0 || block < 0 {
		t.Fatalf("tiny has no MLA layer (%d) or no block start (%d) to drop in", mla, block)
	}
	sa, sb, sd := m.NewState(0, n), m.NewState(0, n), m.NewState(0, n)
	batch, err := m.NewBatch([]*model.SeqState{sa, sb, sd}, [][]int32{a, b, d})
	if err != nil {
		t.Fatal(err)
	}
	drops, calls := 0, 0
	c := model.Calls{
		Budget: 2 * model.KDAChunk,
		Cost:   func(_, lo, hi int) float64 { return float64(hi - lo) },
		Between: func(L, from int, next *kernels.Tensor) int {
			i := -1
			switch {
			case L == mla && batch.Seqs[0] == sa && from > batch.Spans[0].Lo:
				i = 0 // a, the first 300 rows, in the middle of its rows
			case L == block && batch.Seqs[len(batch.Seqs)-1] == sd && from > batch.Spans[0].Hi:
				i = len(batch.Seqs) - 1 // d, the last sequence, before its rows ran
			}
			if i < 0 {
				return from
			}
			drops++
			if (L == block) != (next != nil) {
				t.Errorf("layer %d: the new partial sum %v", L, next)
			}
			sp := batch.Spans[i]
			m.DropSeq(batch, i, next)
			return from - min(max(from-sp.Lo, 0), sp.Len())
		},
		After: func(L, lo, hi int) {
			if hi-lo > 2*model.KDAChunk {
				t.Errorf("layer %d: a call of rows [%d, %d) over the budget", L, lo, hi)
			}
		},
	}
	for L := 0; L < n; L++ {
		k, err := m.RunLayerInCalls(ctx, m.Layers[L], batch, model.PhasePrefill, c)
		if err != nil {
			t.Fatal(err)
		}
		calls += k
	}
	if drops != 2 || len(batch.Seqs) != 1 || batch.Seqs[0] != sb || batch.Rows() != len(b) {
		t.Fatalf("after %d drops: %d sequences, %d rows", drops, len(batch.Seqs), batch.Rows())
	}
	if calls < 3*n {
		t.Fatalf("%d calls over %d layers: the layers were not cut", calls, n)
	}
	batch.Advance()
	got, err := m.Logits(batch)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want[0] {
		if got[0][i] != want[0][i] {
			t.Fatalf("logit %d: %g after the drop, %g alone", i, got[0][i], want[0][i])
		}
	}
	e1, _ := alone.MarshalBinary()
	e2, _ := sb.MarshalBinary()
	if string(e1) != string(e2) {
		t.Fatal("the remaining sequence's state differs from prefilling it alone")
	}
	// Budget and tile both zero: one call per layer.
	one := m.NewState(0, n)
	b1, _ := m.NewBatch([]*model.SeqState{one}, [][]int32{b})
	if k, err := m.RunLayerInCalls(ctx, m.Layers[0], b1, model.PhasePrefill, model.Calls{}); k != 1 || err != nil {
		t.Fatalf("no cut: %d calls, %v", k, err)
	}
}
