package model_test

import (
	"context"
	"math"
	"testing"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// Tolerance between two forms of the same function (chunked vs recurrent
// KDA, expanded vs absorbed MLA): both accumulate in fp64 and round
// activations to fp32 between ops, so logits agree to ~1e-5 relative.
const formAbs, formRel = 2e-4, 1e-4

func loadModel(t *testing.T, preset string, shards int, latent model.DType) *model.Loaded {
	t.Helper()
	dir := testmodel.Dir(t, preset, 1, shards)
	m, err := model.Load(dir, cpu.New(0), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	m.State.LatentDType = latent
	t.Cleanup(func() { m.Close() })
	return m
}

func closeLogits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	var maxErr float64
	for i := range want {
		d := math.Abs(float64(got[i] - want[i]))
		maxErr = math.Max(maxErr, d)
		if d > formAbs+formRel*math.Abs(float64(want[i])) {
			t.Fatalf("%s: logit %d = %g, want %g", what, i, got[i], want[i])
		}
	}
	if model.Argmax(got) != model.Argmax(want) {
		t.Fatalf("%s: argmax %d, want %d", what, model.Argmax(got), model.Argmax(want))
	}
	t.Logf("%s: max abs logit diff %.3g", what, maxErr)
}

// prefillLogits runs prefill(tokens) and returns the last position's logits.
func prefillLogits(t *testing.T, m *model.Model, tokens []int32) []float32 {
	t.Helper()
	s := m.NewState(0, m.Cfg.NumLayers)
	l, err := m.Prefill(context.Background(), []*model.SeqState{s}, [][]int32{tokens})
	if err != nil {
		t.Fatal(err)
	}
	return l[0]
}

// TestPrefillThenDecodeEqualsPrefill: prefill(N) then decode(M) gives the
// logits of prefill(N+M), with the boundary placed across an AttnRes block
// boundary and at the last (MLA) layer's cache length, on tiny and small.
func TestPrefillThenDecodeEqualsPrefill(t *testing.T) {
	for _, tc := range []struct {
		preset string
		shards int
		n, m   int
	}{
		{"tiny", 2, 7, 5}, {"tiny", 2, 1, 3}, {"tiny", 2, 70, 2}, // chunk boundary crossed in prefill
		{"small", 0, 9, 3},
	} {
		if tc.preset == "small" && testing.Short() {
			continue
		}
		m := loadModel(t, tc.preset, tc.shards, model.F32)
		tokens := testkit.Prompt(tc.n+tc.m, m.Cfg.VocabSize, 0)
		want := prefillLogits(t, m.Model, tokens)

		s := m.NewState(0, m.Cfg.NumLayers)
		ctx := context.Background()
		if err := m.PrefillState(ctx, []*model.SeqState{s}, [][]int32{tokens[:tc.n]}); err != nil {
			t.Fatal(err)
		}
		var got []float32
		for _, id := range tokens[tc.n:] {
			l, err := m.Decode(ctx, []*model.SeqState{s}, []int32{id})
			if err != nil {
				t.Fatal(err)
			}
			got = l[0]
		}
		closeLogits(t, tc.preset+" prefill+decode", got, want)
		if s.Tokens != tc.n+tc.m {
			t.Fatalf("state has %d tokens, want %d", s.Tokens, tc.n+tc.m)
		}
	}
}

// TestStateRoundTripContinues: encode -> decode -> continue equals continue,
// bit for bit, for both cache dtypes.
func TestStateRoundTripContinues(t *testing.T) {
	for _, dt := range []model.DType{model.F32, model.BF16} {
		m := loadModel(t, "tiny", 2, dt)
		ctx := context.Background()
		tokens := testkit.Prompt(12, m.Cfg.VocabSize, 0)
		s := m.NewState(0, m.Cfg.NumLayers)
		if err := m.PrefillState(ctx, []*model.SeqState{s}, [][]int32{tokens[:10]}); err != nil {
			t.Fatal(err)
		}
		enc, err := s.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var s2 model.SeqState
		if err := s2.UnmarshalBinary(enc); err != nil {
			t.Fatal(err)
		}
		enc2, _ := s2.MarshalBinary()
		if string(enc) != string(enc2) {
			t.Fatal("re-encoding a decoded state changed its bytes")
		}
		a, err := m.Prefill(ctx, []*model.SeqState{s}, [][]int32{tokens[10:]})
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.Prefill(ctx, []*model.SeqState{&s2}, [][]int32{tokens[10:]})
		if err != nil {
			t.Fatal(err)
		}
		for i := range a[0] {
			if a[0][i] != b[0][i] {
				t.Fatalf("%s cache: logit %d differs after a state round trip: %g vs %g", dt, i, a[0][i], b[0][i])
			}
		}
		// A flipped byte is refused, not accepted.
		enc[len(enc)/2] ^= 1
		if err := s2.UnmarshalBinary(enc); err == nil {
			t.Fatal("corrupted state decoded without error")
		}
	}
}

// TestLayerRangesCompose: running the layers as separate ranges over
// holders that each own only their range equals the whole model, bit for bit.
func TestLayerRangesCompose(t *testing.T) {
	full := loadModel(t, "tiny", 2, model.BF16)
	dir := testmodel.Dir(t, "tiny", 1, 2)
	// Ranges [0,3) [3,4) [4,8) [8,9): layer 3 (MLA) alone, a cut at the
	// AttnRes block boundary 4 and one before the last (MLA) layer 8.
	cuts := []int{0, 3, 4, 8, 9}
	var parts []*model.Loaded
	for i := 0; i+1 < len(cuts); i++ {
		p, err := model.Load(dir, cpu.New(0), model.LoadOptions{Lo: cuts[i], Hi: cuts[i+1], Embed: i == 0, Head: i+2 == len(cuts)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		parts = append(parts, p)
	}
	ctx := context.Background()
	tokens := testkit.Prompt(6, full.Cfg.VocabSize, 0)
	want, err := full.Prefill(ctx, []*model.SeqState{full.NewState(0, 9)}, [][]int32{tokens})
	if err != nil {
		t.Fatal(err)
	}
	states := make([]*model.SeqState, len(parts))
	for i, p := range parts {
		states[i] = p.NewState(cuts[i], cuts[i+1])
	}
	b, err := parts[0].NewBatch([]*model.SeqState{states[0]}, [][]int32{tokens})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range parts {
		b.Seqs = []*model.SeqState{states[i]}
		if err := p.ForwardLayers(ctx, cuts[i], cuts[i+1], b, model.PhasePrefill); err != nil {
			t.Fatal(err)
		}
	}
	got, err := parts[len(parts)-1].Logits(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want[0] {
		if got[0][i] != want[0][i] {
			t.Fatalf("logit %d: ranges give %g, whole model %g", i, got[0][i], want[0][i])
		}
	}
}

// TestBatchIndependence: a sequence's results do not depend on the other
// sequences in its batch (what makes shared weight passes exact).
func TestBatchIndependence(t *testing.T) {
	m := loadModel(t, "tiny", 2, model.BF16)
	ctx := context.Background()
	a, b := testkit.Prompt(5, m.Cfg.VocabSize, 0), testkit.Prompt(9, m.Cfg.VocabSize, 0)[2:]
	alone := m.NewState(0, 9)
	want, err := m.Prefill(ctx, []*model.SeqState{alone}, [][]int32{a})
	if err != nil {
		t.Fatal(err)
	}
	s1, s2 := m.NewState(0, 9), m.NewState(0, 9)
	got, err := m.Prefill(ctx, []*model.SeqState{s2, s1}, [][]int32{b, a})
	if err != nil {
		t.Fatal(err)
	}
	for i := range want[0] {
		if got[1][i] != want[0][i] {
			t.Fatalf("logit %d differs when batched: %g vs %g", i, got[1][i], want[0][i])
		}
	}
	e1, _ := alone.MarshalBinary()
	e2, _ := s1.MarshalBinary()
	if string(e1) != string(e2) {
		t.Fatal("state differs when batched")
	}
}

// TestGenerateDeterministic: greedy generation is reproducible.
func TestGenerateDeterministic(t *testing.T) {
	m := loadModel(t, "tiny", 2, model.BF16)
	ctx := context.Background()
	p := []int32{5, 17, 200}
	a, err := m.Generate(ctx, p, 8)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.Generate(ctx, p, 8)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("generation not deterministic: %v vs %v", a, b)
		}
	}
	t.Logf("tiny greedy: %v", a)
}
