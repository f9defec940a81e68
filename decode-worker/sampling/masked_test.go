package sampling

import (
	"math/rand/v2"
	"testing"
)

func maskOf(n int, ids ...int) []uint64 {
	m := make([]uint64, (n+63)/64)
	for _, id := range ids {
		m[id/64] |= 1 << (id % 64)
	}
	return m
}

func TestSampleMaskedGreedy(t *testing.T) {
	logits := []float32{5, 1, 3, 3, 9, 0}
	s, _ := New(Params{})
	for _, tc := range []struct {
		allow []int
		want  int32
	}{{[]int{0, 1, 2, 3, 4, 5}, 4}, {[]int{1, 2, 3}, 2}, {[]int{5}, 5}, {[]int{1, 5}, 1}} {
		got, err := s.SampleMasked(logits, maskOf(len(logits), tc.allow...))
		if err != nil || got != tc.want {
			t.Errorf("allow %v: got %d, %v; want %d", tc.allow, got, err, tc.want)
		}
	}
	for _, p := range []Params{{}, {Temperature: 1}, {Temperature: 1, TopK: 2}} {
		s, _ := New(p)
		if _, err := s.SampleMasked(logits, maskOf(len(logits))); err == nil {
			t.Errorf("%+v: an empty mask sampled", p)
		}
	}
}

func TestSampleMaskedRandom(t *testing.T) {
	const n = 300
	logits := randomLogits(rand.New(rand.NewPCG(1, 2)), n)
	allow := []int{3, 64, 65, 127, 128, 200, 299}
	mask := maskOf(n, allow...)
	full := maskOf(n)
	for i := range full {
		full[i] = ^uint64(0)
	}
	for _, p := range []Params{
		{Temperature: 1, Seed: 7},
		{Temperature: 0.7, TopK: 3, Seed: 8},
		{Temperature: 1.3, TopP: 0.5, Seed: 9},
		{Temperature: 2, TopK: 50, TopP: 0.9, Seed: 10},
	} {
		a, _ := New(p)
		b, _ := New(p)
		plain, _ := New(p)
		unmasked, _ := New(p)
		seen := map[int32]bool{}
		for range 400 {
			x, err := a.SampleMasked(logits, mask)
			if err != nil {
				t.Fatal(err)
			}
			y, _ := b.SampleMasked(logits, mask)
			if x != y {
				t.Fatalf("%+v: same seed, draws %d and %d", p, x, y)
			}
			if mask[x/64]&(1<<(x%64)) == 0 {
				t.Fatalf("%+v: drew %d, masked off", p, x)
			}
			seen[x] = true
			// A mask that allows every id changes nothing.
			u, _ := plain.Sample(logits)
			v, _ := unmasked.SampleMasked(logits, full)
			if u != v {
				t.Fatalf("%+v: Sample %d, SampleMasked with a full mask %d", p, u, v)
			}
		}
		if p.TopK == 0 && p.TopP == 0 && len(seen) < 3 {
			t.Errorf("%+v: drew only %v", p, seen)
		}
	}
}
