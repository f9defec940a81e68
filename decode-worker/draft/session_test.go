package draft

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestSessionIndex(t *testing.T) {
	cfg := SessionConfig{MinN: 1, MaxN: 3, MaxTokens: 1000, PerKey: 16}
	for _, tc := range []struct {
		name   string
		chains [][]int32
		query  []int32
		k      int
		want   []int32
	}{
		{"earlier turn", [][]int32{seq(5, 6, 7, 8, 9)}, seq(1, 6, 7), 2, seq(8, 9)},
		{"chain end cuts the draft", [][]int32{seq(5, 6, 7, 8)}, seq(1, 6, 7), 5, seq(8)},
		{"longest match across chains", [][]int32{seq(0, 1, 2, 3), seq(9, 1, 2, 4)}, seq(9, 1, 2), 1, seq(4)},
		{"chains disagree", [][]int32{seq(0, 1, 2, 3), seq(9, 1, 2, 4)}, seq(5, 1, 2), 1, nil},
		{"chains agree", [][]int32{seq(0, 1, 2, 3, 4), seq(9, 1, 2, 3, 5)}, seq(5, 1, 2), 3, seq(3)},
		{"no match", [][]int32{seq(0, 1, 2, 3)}, seq(7), 2, nil},
		{"last token of a chain has no continuation", [][]int32{seq(0, 1, 2, 3)}, seq(3), 2, nil},
		{"empty query", [][]int32{seq(0, 1)}, nil, 2, nil},
	} {
		s, err := NewSessionIndex(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range tc.chains {
			s.Add(uint64(i), c)
		}
		if got := s.Draft(tc.query, tc.k); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	if _, err := NewSessionIndex(SessionConfig{MinN: 1, MaxN: 2}); err == nil {
		t.Error("MaxTokens 0 accepted")
	}
}

func TestSessionIndexEviction(t *testing.T) {
	s, _ := NewSessionIndex(SessionConfig{MinN: 2, MaxN: 4, MaxTokens: 10, PerKey: 8})
	s.Add(1, seq(1, 2, 3, 4))
	s.Add(2, seq(5, 6, 7, 8))
	if got := s.Draft(seq(1, 2), 1); !slices.Equal(got, seq(3)) {
		t.Fatalf("before eviction: got %v", got)
	}
	s.Add(3, seq(9, 10, 11, 12)) // 12 tokens: chain 1 goes
	if s.Tokens() != 8 || s.Len() != 2 {
		t.Errorf("after eviction: %d tokens in %d chains, want 8 in 2", s.Tokens(), s.Len())
	}
	if got := s.Draft(seq(1, 2), 1); got != nil {
		t.Errorf("evicted chain still drafts %v", got)
	}
	if got := s.Draft(seq(5, 6), 1); !slices.Equal(got, seq(7)) {
		t.Errorf("kept chain: got %v", got)
	}
	s.Add(2, seq(5, 6, 0)) // replaces chain 2
	if got := s.Draft(seq(5, 6), 1); !slices.Equal(got, seq(0)) || s.Tokens() != 7 {
		t.Errorf("replaced chain: got %v, %d tokens", got, s.Tokens())
	}
	if !s.Remove(2) || s.Remove(2) || s.Draft(seq(5, 6), 1) != nil {
		t.Error("Remove did not forget chain 2 once")
	}
	s.Add(4, seq(20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)) // longer than the cap
	if s.Tokens() != 10 || s.Len() != 1 {
		t.Errorf("long chain: %d tokens in %d chains, want its last 10 alone", s.Tokens(), s.Len())
	}
	if got := s.Draft(seq(22, 23), 1); !slices.Equal(got, seq(24)) {
		t.Errorf("long chain tail: got %v", got)
	}
	if got := s.Draft(seq(20, 21), 1); got != nil {
		t.Errorf("long chain head kept: %v", got)
	}
	// Churn without eviction keeps the bookkeeping bounded.
	for i := range 1000 {
		s.Add(uint64(100+i%3), seq(1, 2))
	}
	if len(s.order) > 2*s.Len()+16 || len(s.index) > 20 {
		t.Errorf("after churn: order %d, index %d keys, %d chains", len(s.order), len(s.index), s.Len())
	}
}

func TestSessionIndexPerKey(t *testing.T) {
	s, _ := NewSessionIndex(SessionConfig{MinN: 1, MaxN: 1, MaxTokens: 100, PerKey: 2})
	s.Add(1, seq(1, 5))
	s.Add(2, seq(1, 6))
	s.Add(3, seq(1, 6))
	// Only the two newest occurrences of 1 are kept: they agree.
	if got := s.Draft(seq(1), 1); !slices.Equal(got, seq(6)) {
		t.Errorf("got %v, want [6]", got)
	}
}

func TestSessionIndexMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 1000 {
		minN := 1 + rng.IntN(2)
		maxN := minN + rng.IntN(3)
		s, _ := NewSessionIndex(SessionConfig{MinN: minN, MaxN: maxN, MaxTokens: 1 << 20, PerKey: 1 << 20})
		vocab := 2 + rng.IntN(5)
		gen := func(n int) []int32 {
			out := make([]int32, n)
			for j := range out {
				out[j] = int32(rng.IntN(vocab))
			}
			return out
		}
		var chains [][]int32
		for c := range 1 + rng.IntN(4) {
			chains = append(chains, gen(rng.IntN(30)))
			s.Add(uint64(c), chains[c])
		}
		q := gen(rng.IntN(8))
		k := rng.IntN(6)
		if got, want := s.Draft(q, k), naive(chains, q, minN, maxN, k); !slices.Equal(got, want) {
			t.Fatalf("case %d: chains %v query %v MinN %d MaxN %d k %d: got %v, want %v", i, chains, q, minN, maxN, k, got, want)
		}
	}
}
