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

// TestFoldKeysImagesByHash: two prompts that differ only in which image of
// one size they hold get different links from the image's block on and the
// same before it; the same image gets the same links; the prompt itself is
// left alone.
func TestFoldKeysImagesByHash(t *testing.T) {
	salt := Salt("m", 2)
	p := seq(300, 3)
	for k := 100; k < 140; k++ {
		p[k] = 21 // the pad run
	}
	a, b := Image{At: 100, Len: 40}, Image{At: 100, Len: 40}
	a.Hash[0], b.Hash[0] = 1, 2
	fa, fb, fa2 := Fold(p, []Image{a}), Fold(p, []Image{b}), Fold(p, []Image{a})
	if p[100] != 21 {
		t.Fatal("Fold changed its input")
	}
	ca, cb, ca2, plain := Chain(SHA256, salt, fa), Chain(SHA256, salt, fb), Chain(SHA256, salt, fa2), Chain(SHA256, salt, p)
	if ca[0] != cb[0] || ca[0] != plain[0] {
		t.Fatal("the block before the image differs")
	}
	for i := 1; i < len(ca); i++ {
		if ca[i] == cb[i] {
			t.Fatalf("link %d is the same for two different images", i)
		}
		if ca[i] == plain[i] {
			t.Fatalf("link %d of the folded prompt is the plain prompt's", i)
		}
		if ca[i] != ca2[i] {
			t.Fatalf("link %d differs for the same image", i)
		}
	}
	for k := 100; k < 140; k++ {
		if fa[k] >= 0 {
			t.Fatalf("folded position %d is %d, a token id", k, fa[k])
		}
	}
	if q := Fold(p, nil); &q[0] != &p[0] {
		t.Fatal("a prompt without images was copied")
	}
}
