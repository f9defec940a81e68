package model_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/model"
)

// oneByOne decodes toks one at a time from a copy of base and returns the
// logits after each token and the encoded state after each (states[j] holds
// toks[:j+1]); states[-1] is base itself, as states0.
func oneByOne(t *testing.T, m *model.Model, base *model.SeqState, toks []int32) (logits [][]float32, states [][]byte, states0 []byte) {
	t.Helper()
	s := base.Clone()
	states0 = encode(t, s)
	for _, tok := range toks {
		l, err := m.Decode(context.Background(), []*model.SeqState{s}, []int32{tok})
		if err != nil {
			t.Fatal(err)
		}
		logits = append(logits, l[0])
		states = append(states, encode(t, s))
	}
	return logits, states, states0
}

func encode(t *testing.T, s *model.SeqState) []byte {
	t.Helper()
	b, err := s.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameBits(what string, got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("%s: value %d = %g, want %g (bit for bit)", what, i, got[i], want[i])
		}
	}
	return nil
}

// firstLayerDiff names the first layer whose state differs (for a clear
// failure), comparing two sequence states part by part.
func firstLayerDiff(a, b *model.SeqState) string {
	if a.Tokens != b.Tokens {
		return fmt.Sprintf("tokens %d vs %d", a.Tokens, b.Tokens)
	}
	for L := range a.Layers {
		la, lb := a.Layers[L], b.Layers[L]
		if la == nil || lb == nil {
			continue
		}
		for i := range la.Parts {
			if !bytes.Equal(la.Parts[i].Data, lb.Parts[i].Data) {
				return fmt.Sprintf("layer %d (%s) part %s", L, la.Kind, la.Parts[i].Kind)
			}
		}
	}
	return "encoding only"
}

// TestVerifyEqualsDecodingOneByOne is the foundation of exact speculative
// decoding: a decode step in which a sequence takes its last token and k
// drafts gives each row the logits, bit for bit, that decoding the tokens
// one at a time gives, with another sequence's ordinary decode row in the
// same batch (also unchanged); and committing any number of rows 0..k+1
// leaves a state byte-identical to decoding that many tokens one at a time
// (every KDA state, conv tail and MLA cache), from which decoding goes on
// alike.
func TestVerifyEqualsDecodingOneByOne(t *testing.T) {
	for _, preset := range []string{"tiny", "small"} {
		t.Run(preset, func(t *testing.T) {
			if preset == "small" && testing.Short() {
				t.Skip("small preset under -short")
			}
			m := loadModel(t, preset, 1, model.BF16)
			checkVerify(t, m.Model, 4)
		})
	}
}

func checkVerify(t *testing.T, m *model.Model, k int) {
	ctx := context.Background()
	V := m.Cfg.VocabSize
	prompt := testkit.Prompt(70, V, 3) // past a KDA chunk, so prefill used the chunked form
	base := m.NewState(0, m.Cfg.NumLayers)
	if err := m.PrefillState(ctx, []*model.SeqState{base}, [][]int32{prompt[:len(prompt)-1]}); err != nil {
		t.Fatal(err)
	}
	toks := append([]int32{prompt[len(prompt)-1]}, testkit.Prompt(k+1, V, 9)...) // last token, k drafts, one more
	want, states, states0 := oneByOne(t, m, base, toks)

	other := m.NewState(0, m.Cfg.NumLayers)
	if err := m.PrefillState(ctx, []*model.SeqState{other}, [][]int32{testkit.Prompt(9, V, 5)}); err != nil {
		t.Fatal(err)
	}
	otherWant, _, _ := oneByOne(t, m, other, []int32{7})

	for n := 0; n <= k+1; n++ {
		s, o := base.Clone(), other.Clone()
		got, err := m.Verify(ctx, []*model.SeqState{o, s}, [][]int32{{7}, toks[:k+1]})
		if err != nil {
			t.Fatal(err)
		}
		if err := sameBits("the other sequence's logits", got[0][0], otherWant[0]); err != nil {
			t.Fatal(err)
		}
		for r := 0; r <= k; r++ {
			if err := sameBits(fmt.Sprintf("verify row %d", r), got[1][r], want[r]); err != nil {
				t.Fatal(err)
			}
		}
		if s.Pending() != k+1 || s.Tokens != base.Tokens {
			t.Fatalf("after the verify step: %d rows pending, %d tokens; want %d, %d", s.Pending(), s.Tokens, k+1, base.Tokens)
		}
		if err := m.Commit(s, n); err != nil {
			t.Fatal(err)
		}
		wantState := states0
		if n > 0 {
			wantState = states[n-1]
		}
		if got := encode(t, s); !bytes.Equal(got, wantState) {
			var ref model.SeqState
			if err := ref.UnmarshalBinary(wantState); err != nil {
				t.Fatal(err)
			}
			t.Fatalf("commit of %d rows: state differs from decoding %d tokens one by one: %s", n, n, firstLayerDiff(s, &ref))
		}
		// Decoding goes on alike: the next token after the accepted ones.
		next := toks[n]
		l, err := m.Decode(ctx, []*model.SeqState{s}, []int32{next})
		if err != nil {
			t.Fatal(err)
		}
		if err := sameBits(fmt.Sprintf("the decode step after a commit of %d", n), l[0], want[n]); err != nil {
			t.Fatal(err)
		}
	}
	// The byte comparison can tell the counts apart.
	if bytes.Equal(states[0], states[1]) {
		t.Fatal("states after one and two tokens are equal: the check cannot fail")
	}
}

// TestVerifyPendingIsGuarded: a pending verify step must be committed before
// the sequence steps again or its state is encoded, and a commit's count is
// checked.
func TestVerifyPendingIsGuarded(t *testing.T) {
	m := loadModel(t, "tiny", 1, model.BF16)
	ctx := context.Background()
	s := m.NewState(0, m.Cfg.NumLayers)
	if _, err := m.Verify(ctx, []*model.SeqState{s}, [][]int32{{3, 4, 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Decode(ctx, []*model.SeqState{s}, []int32{6}); err == nil {
		t.Fatal("a decode step ran over an uncommitted verify step")
	}
	if _, err := m.Verify(ctx, []*model.SeqState{s}, [][]int32{{3, 4, 5}}); err == nil {
		t.Fatal("a second verify step ran over an uncommitted one")
	}
	if _, err := s.MarshalBinary(); err == nil {
		t.Fatal("a state with an uncommitted verify step was encoded")
	}
	for _, n := range []int{-1, 4} {
		if err := m.Commit(s, n); err == nil {
			t.Fatalf("a commit of %d rows of a verify step of 3 was taken", n)
		}
	}
	if err := m.Commit(s, 2); err != nil {
		t.Fatal(err)
	}
	if s.Tokens != 2 || s.Pending() != 0 {
		t.Fatalf("after a commit of 2: %d tokens, %d pending", s.Tokens, s.Pending())
	}
	if err := m.Commit(s, 1); err == nil {
		t.Fatal("a commit with no verify step pending was taken")
	}
	if _, err := m.Decode(ctx, []*model.SeqState{s}, []int32{6}); err != nil {
		t.Fatal(err)
	}
}
