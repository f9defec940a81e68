package draft

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// naive drafts by the package's rule as written: the longest suffix n
// (MaxN down to MinN) with an occurrence ending before each source's end,
// then position by position while the continuations that reach it agree.
func naive(srcs [][]int32, query []int32, minN, maxN, k int) []int32 {
	m := len(query)
	for n := min(maxN, m); n >= minN; n-- {
		var conts [][]int32
		for _, src := range srcs {
			for e := n; e < len(src); e++ {
				if slices.Equal(src[e-n:e], query[m-n:]) {
					conts = append(conts, src[e:min(e+k, len(src))])
				}
			}
		}
		if len(conts) == 0 {
			continue
		}
		var out []int32
		for d := range k {
			var tok int32
			reached, agree := false, true
			for _, c := range conts {
				if len(c) > d {
					if reached && c[d] != tok {
						agree = false
					}
					tok, reached = c[d], true
				}
			}
			if !reached || !agree {
				break
			}
			out = append(out, tok)
		}
		return out
	}
	return nil
}

func seq(s ...int32) []int32 { return s }

func TestPromptLookup(t *testing.T) {
	for _, tc := range []struct {
		name       string
		minN, maxN int
		window     int
		toks       []int32
		k          int
		want       []int32
	}{
		{"no repeat", 1, 3, 0, seq(1, 2, 3, 4), 4, nil},
		{"one occurrence", 1, 3, 0, seq(1, 2, 3, 4, 1, 2), 3, seq(3, 4, 1)},
		{"k caps", 1, 3, 0, seq(1, 2, 3, 4, 1, 2), 1, seq(3)},
		{"k zero", 1, 3, 0, seq(1, 2, 3, 4, 1, 2), 0, nil},
		{"continuations disagree", 1, 3, 0, seq(1, 2, 5, 7, 1, 2, 6, 9, 1, 2), 3, nil},
		{"common prefix only", 1, 3, 0, seq(8, 1, 2, 3, 4, 9, 7, 1, 2, 3, 5, 9, 6, 1, 2), 4, seq(3)},
		{"longest match decides", 1, 3, 0, seq(7, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2), 2, seq(3, 8)},
		{"shorter max: disagreement", 1, 2, 0, seq(7, 1, 2, 3, 8, 1, 2, 4, 7, 1, 2), 2, nil},
		{"cut-short continuation does not vote", 2, 2, 0, seq(1, 2, 1, 2, 1, 2), 4, seq(1, 2, 1, 2)},
		{"below MinN", 2, 3, 0, seq(5, 1, 6, 1), 2, nil},
		{"window hides the occurrence", 1, 3, 3, seq(1, 2, 3, 4, 1, 2), 3, nil},
		{"window keeps it", 1, 3, 6, seq(1, 2, 3, 4, 1, 2), 3, seq(3, 4, 1)},
		{"bad settings", 0, 3, 0, seq(1, 2, 1), 2, nil},
		{"too short", 1, 1, 0, seq(1), 2, nil},
	} {
		p := PromptLookup{MinN: tc.minN, MaxN: tc.maxN, Window: tc.window}
		toks := slices.Clone(tc.toks)
		got := p.Draft(toks, tc.k)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
		if !slices.Equal(toks, tc.toks) {
			t.Errorf("%s: changed its input", tc.name)
		}
		if len(got) > 0 {
			got[0] = -1
			if !slices.Equal(toks, tc.toks) {
				t.Errorf("%s: the draft aliases the input", tc.name)
			}
		}
	}
	if (PromptLookup{MinN: 2, MaxN: 1}).Validate() == nil {
		t.Error("MaxN < MinN validated")
	}
}

func TestPromptLookupMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	hits := 0
	for i := range 3000 {
		toks := make([]int32, 1+rng.IntN(60))
		vocab := 2 + rng.IntN(6)
		for j := range toks {
			toks[j] = int32(rng.IntN(vocab))
		}
		minN := 1 + rng.IntN(3)
		maxN := minN + rng.IntN(3)
		k := rng.IntN(8)
		got := PromptLookup{MinN: minN, MaxN: maxN}.Draft(toks, k)
		want := naive([][]int32{toks}, toks, minN, maxN, k)
		if !slices.Equal(got, want) {
			t.Fatalf("case %d: %v MinN %d MaxN %d k %d: got %v, want %v", i, toks, minN, maxN, k, got, want)
		}
		if len(got) > 0 {
			hits++
		}
	}
	if hits < 300 {
		t.Errorf("only %d of 3000 cases drafted anything", hits)
	}
}

func TestFirst(t *testing.T) {
	s, _ := NewSessionIndex(SessionConfig{MinN: 1, MaxN: 4, MaxTokens: 100, PerKey: 8})
	s.Add(1, seq(9, 8, 7, 6))
	f := First{PromptLookup{MinN: 1, MaxN: 4}, s}
	if got := f.Draft(seq(1, 2, 1), 2); !slices.Equal(got, seq(2, 1)) {
		t.Errorf("own tokens first: got %v", got)
	}
	if got := f.Draft(seq(1, 2, 8), 2); !slices.Equal(got, seq(7, 6)) {
		t.Errorf("session second: got %v", got)
	}
	if got := f.Draft(seq(1, 2, 3), 2); got != nil {
		t.Errorf("neither: got %v", got)
	}
}

// BenchmarkPromptLookup drafts from a 32k-token sequence of Zipf-distributed
// ids (so the last token recurs often) whose last 40 tokens repeat an
// earlier passage. "scan" is the floor: one pass comparing every token with
// the last.
func BenchmarkPromptLookup(b *testing.B) {
	const n = 32 << 10
	rng := rand.New(rand.NewPCG(3, 4))
	z := rand.NewZipf(rng, 1.1, 1, 50_000)
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(z.Uint64())
	}
	copy(toks[n-40:], toks[n/2:n/2+40])
	p := PromptLookup{MinN: 1, MaxN: 4}
	b.Run("draft", func(b *testing.B) {
		var d []int32
		for b.Loop() {
			d = p.Draft(toks, 8)
		}
		if len(d) == 0 {
			b.Fatal("no draft")
		}
	})
	b.Run("scan", func(b *testing.B) {
		c := 0
		for b.Loop() {
			last := toks[n-1]
			for _, t := range toks[:n-1] {
				if t == last {
					c++
				}
			}
		}
		if c == 0 {
			b.Fatal("no recurrence")
		}
	})
}
