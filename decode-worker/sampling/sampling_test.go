package sampling

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/model"
)

func randomLogits(rng *rand.Rand, n int) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(rng.NormFloat64() * 3)
	}
	return l
}

func TestGreedyIsModelArgmax(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s, err := New(Params{TopK: 3, TopP: 0.5, Seed: 9}) // ignored when greedy
	if err != nil {
		t.Fatal(err)
	}
	cases := [][]float32{
		{1, 3, 3, 2},                               // tie: first wins
		{float32(math.NaN()), 1, 2},                // NaN never wins over numbers
		{-1, float32(math.Inf(1)), 5},              // +Inf wins
		{float32(math.NaN()), float32(math.NaN())}, // all NaN: index 0
	}
	for i := 0; i < 50; i++ {
		l := randomLogits(rng, 1000)
		l[rng.IntN(1000)] = l[rng.IntN(1000)] // plant ties
		cases = append(cases, l)
	}
	for i, l := range cases {
		got, err := s.Sample(l)
		if err != nil {
			t.Fatal(err)
		}
		if want := model.Argmax(l); int(got) != want {
			t.Fatalf("case %d: greedy picked %d, model.Argmax %d", i, got, want)
		}
	}
}

func draws(t *testing.T, p Params, logits []float32, n int) []int32 {
	t.Helper()
	s, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int32, n)
	for i := range out {
		if out[i], err = s.Sample(logits); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestSeedDeterminism(t *testing.T) {
	l := randomLogits(rand.New(rand.NewPCG(3, 4)), 5000)
	p := Params{Temperature: 0.9, TopK: 200, TopP: 0.95, Seed: 42}
	a, b := draws(t, p, l, 100), draws(t, p, l, 100)
	if !slices.Equal(a, b) {
		t.Fatal("same seed gave different tokens")
	}
	p.Seed = 43
	if c := draws(t, p, l, 100); slices.Equal(a, c) {
		t.Fatal("different seeds gave the same 100 tokens")
	}
}

// TestDistribution: with temperature 1 and no filter, empirical frequencies
// follow the softmax (fixed seed, so the bound is checked, not flaky).
func TestDistribution(t *testing.T) {
	l := []float32{0, 1, 2, 0.5}
	const n = 40000
	got := draws(t, Params{Temperature: 1, Seed: 5}, l, n)
	var count [4]int
	for _, id := range got {
		count[id]++
	}
	var z float64
	for _, x := range l {
		z += math.Exp(float64(x))
	}
	for i, x := range l {
		want := math.Exp(float64(x)) / z
		freq := float64(count[i]) / n
		if sd := math.Sqrt(want * (1 - want) / n); math.Abs(freq-want) > 5*sd {
			t.Errorf("token %d: frequency %.4f, softmax %.4f (5 sd = %.4f)", i, freq, want, 5*sd)
		}
	}
	// A lower temperature concentrates on the top token.
	cold := draws(t, Params{Temperature: 0.1, Seed: 5}, l, 2000)
	top := 0
	for _, id := range cold {
		if id == 2 {
			top++
		}
	}
	if top < 1990 {
		t.Errorf("temperature 0.1: top token drawn %d of 2000 times", top)
	}
}

func TestTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	l := randomLogits(rng, 3000)
	order := make([]int, len(l))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case l[a] > l[b]:
			return -1
		case l[a] < l[b]:
			return 1
		}
		return 0
	})
	allowed := map[int32]bool{}
	for _, i := range order[:5] {
		allowed[int32(i)] = true
	}
	seen := map[int32]bool{}
	for _, id := range draws(t, Params{Temperature: 5, TopK: 5, Seed: 1}, l, 2000) {
		if !allowed[id] {
			t.Fatalf("top_k 5 drew token %d (logit %v), outside the top 5", id, l[id])
		}
		seen[id] = true
	}
	if len(seen) != 5 {
		t.Errorf("temperature 5 over the top 5 drew only %d distinct tokens", len(seen))
	}
	for _, id := range draws(t, Params{Temperature: 3, TopK: 1, Seed: 1}, l, 50) {
		if int(id) != Argmax(l) {
			t.Fatalf("top_k 1 drew %d, not the argmax %d", id, Argmax(l))
		}
	}
}

func TestTopP(t *testing.T) {
	// Probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1.
	ln := func(p float64) float32 { return float32(math.Log(p)) }
	l := []float32{ln(0.125), ln(0.5), ln(0.125), ln(0.25)}
	for _, tc := range []struct {
		p       float64
		allowed []int32
	}{
		{0.4, []int32{1}},        // the top token alone reaches 0.4
		{0.7, []int32{1, 3}},     // 0.5 + 0.25
		{0.8, []int32{1, 3, 0}},  // + the first of the tied 0.125s (lower id)
		{1, []int32{0, 1, 2, 3}}, // no limit
		{1e-9, []int32{1}},       // at least one token
	} {
		seen := map[int32]bool{}
		for _, id := range draws(t, Params{Temperature: 1, TopP: tc.p, Seed: 11}, l, 3000) {
			if !slices.Contains(tc.allowed, id) {
				t.Fatalf("top_p %v drew token %d, allowed %v", tc.p, id, tc.allowed)
			}
			seen[id] = true
		}
		if len(seen) != len(tc.allowed) {
			t.Errorf("top_p %v: drew %d distinct tokens, want all of %v", tc.p, len(seen), tc.allowed)
		}
	}
	// Top-k then top-p: the nucleus of the top 2 (0.5, 0.25 renormalised).
	for _, id := range draws(t, Params{Temperature: 1, TopK: 2, TopP: 0.6, Seed: 2}, l, 500) {
		if id != 1 {
			t.Fatalf("top_k 2 + top_p 0.6 drew %d, want only 1 (0.5/0.75 = 0.67 >= 0.6)", id)
		}
	}
}

func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		p    Params
		want string
	}{
		{Params{Temperature: -1}, "temperature"},
		{Params{Temperature: math.NaN()}, "temperature"},
		{Params{Temperature: 101}, "temperature"},
		{Params{TopK: -2}, "top_k"},
		{Params{TopP: 1.5}, "top_p"},
		{Params{TopP: math.NaN()}, "top_p"},
	} {
		if _, err := New(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %s", tc.p, err, tc.want)
		}
	}
	s, _ := New(Params{Temperature: 1})
	if _, err := s.Sample([]float32{1, float32(math.Inf(-1)), 2}); err == nil || !strings.Contains(err.Error(), "logit 1") {
		t.Errorf("non-finite logit: %v", err)
	}
	if _, err := s.Sample(nil); err == nil {
		t.Error("empty logits accepted")
	}
}

func BenchmarkSample(b *testing.B) {
	l := randomLogits(rand.New(rand.NewPCG(1, 1)), 163840)
	for _, p := range []Params{{}, {Temperature: 0.8, Seed: 1}, {Temperature: 0.8, TopK: 50, Seed: 1}, {Temperature: 0.8, TopP: 0.9, Seed: 1}} {
		s, _ := New(p)
		b.Run(strings.NewReplacer(" ", "", "{", "", "}", "").Replace(fmtParams(p)), func(b *testing.B) {
			for b.Loop() {
				if _, err := s.Sample(l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func fmtParams(p Params) string {
	switch {
	case p.Greedy():
		return "greedy"
	case p.TopK > 0:
		return "topk"
	case p.TopP > 0:
		return "topp"
	}
	return "temperature"
}

// sampleDigest is the SHA-256 of sampledSequences' tokens and softmax
// weights, computed on amd64. The same test run for arm64 (scripts/test.sh
// runs this package under qemu) checks that a seeded sampler draws the same
// tokens from the same weights on the decode workers' architecture: with
// math.Exp, arm64's weights differ in their last bits.
const sampleDigest = "55d0d31621c9448e66b4a182ff34942533c3aa0f34415d5967d131bf3169f044"

// sampledSequences draws 64-token sequences under several parameter sets
// and returns every draw's token and weights, little-endian. The logits are
// multiples of 2^-16 (exact in float32 on every architecture, unlike
// NormFloat64's), and each drawn token's logit drops by 1/2 before the next
// draw, so every step sees different logits.
func sampledSequences(t *testing.T) []byte {
	var out []byte
	for _, p := range []Params{
		{Temperature: 1, Seed: 1},
		{Temperature: 0.7, TopK: 50, Seed: 2},
		{Temperature: 1.3, TopP: 0.9, Seed: 3},
		{Temperature: 0.9, TopK: 200, TopP: 0.95, Seed: 4},
		{Temperature: 37.5, Seed: 5},
	} {
		rng := rand.New(rand.NewPCG(p.Seed, 99))
		l := make([]float32, 2000)
		for i := range l {
			l[i] = float32(rng.IntN(1<<20)-1<<19) / (1 << 16) // in [-8, 8)
		}
		s, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		for range 64 {
			id, err := s.Sample(l)
			if err != nil {
				t.Fatal(err)
			}
			out = binary.LittleEndian.AppendUint32(out, uint32(id))
			for _, w := range s.w {
				out = binary.LittleEndian.AppendUint64(out, math.Float64bits(w))
			}
			l[id] -= 0.5
		}
	}
	return out
}

func TestSampleDigest(t *testing.T) {
	sum := sha256.Sum256(sampledSequences(t))
	if got := hex.EncodeToString(sum[:]); got != sampleDigest {
		t.Fatalf("sampling digest on %s: %s, want %s (computed on amd64)", runtime.GOARCH, got, sampleDigest)
	}
}
