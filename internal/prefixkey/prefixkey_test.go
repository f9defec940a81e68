package prefixkey

import "testing"

func seq(n, seed int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((seed*7919 + i*104729 + 13) % 256)
	}
	return out
}

// TestLongest: a holder's advertised links find the longest prefix it can
// resume from, within the limit, and only for the length each link names.
func TestLongest(t *testing.T) {
	salt := Salt("m", 2)
	a := seq(300, 1)
	ch := Chain(SHA256, salt, a)
	held := map[Hash]int{ch[0]: 64, ch[2]: 192}
	for _, tc := range []struct {
		tokens []int32
		limit  int
		want   int
	}{
		{a, 299, 192},
		{a, 191, 64}, // 192 is past the limit
		{a[:150], 149, 64},
		{seq(300, 2), 299, 0},
		{append(append([]int32(nil), a[:64]...), seq(200, 3)...), 263, 64},
	} {
		if got := Longest(SHA256, salt, tc.tokens, tc.limit, held); got != tc.want {
			t.Errorf("Longest(%d tokens, limit %d) = %d, want %d", len(tc.tokens), tc.limit, got, tc.want)
		}
	}
	// Another seed (another model or dtype) matches nothing.
	if got := Longest(SHA256, Salt("m", 1), a, 299, held); got != 0 {
		t.Errorf("another salt matched %d tokens", got)
	}
	// A link advertised with a length it does not stand for is ignored.
	if got := Longest(SHA256, salt, a, 299, map[Hash]int{ch[2]: 128}); got != 0 {
		t.Errorf("a mislabelled link matched %d tokens", got)
	}
}
