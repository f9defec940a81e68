package tokenizer

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// randomTokenizer has the 256 bytes and n random merges over a small
// alphabet, so that long pieces merge in many ways.
func randomTokenizer(t testing.TB, rng *rand.Rand, n int) *Tokenizer {
	seen := map[string]bool{}
	var extra []string
	for len(extra) < n {
		l := 2 + rng.IntN(5)
		b := make([]byte, l)
		for i := range b {
			b[i] = "abc"[rng.IntN(3)]
		}
		if !seen[string(b)] {
			seen[string(b)] = true
			extra = append(extra, string(b))
		}
	}
	tok, err := Parse([]byte(byteRanks(extra...)), []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestMergeLongMatchesMergeShort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		tok := randomTokenizer(t, rng, 10+rng.IntN(200))
		e := newEncoder(tok)
		for range 40 {
			b := make([]byte, 2+rng.IntN(300))
			for i := range b {
				b[i] = "abcd"[rng.IntN(4)]
			}
			p := string(b)
			short := e.mergeShort(nil, p)
			long := e.mergeLong(nil, p)
			if !reflect.DeepEqual(short, long) {
				t.Fatalf("round %d: piece %q: short merge %v, heap merge %v", round, p, short, long)
			}
			var sb strings.Builder
			for _, id := range short {
				sb.WriteString(tok.v.bytes(id))
			}
			if sb.String() != p {
				t.Fatalf("merged tokens of %q spell %q", p, sb.String())
			}
		}
	}
}

func TestMergeOrder(t *testing.T) {
	// Ranks: "bc" merges before "ab"; "xyz" cannot be reached by merging
	// (no "xy" or "yz") but is used when it is the whole piece.
	tok, err := Parse([]byte(byteRanks("bc", "ab", "aa", "xyz")), []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	ids := func(s ...string) []int {
		var out []int
		for _, x := range s {
			out = append(out, tok.v.rank[x])
		}
		return out
	}
	tests := []struct {
		in   string
		want []int
	}{
		{"xyz", ids("xyz")},               // the whole piece is a token
		{"xyzw", ids("x", "y", "z", "w")}, // but no merge leads to it
		{"abcd", ids("a", "bc", "d")},     // bc (256) beats ab (257)
		{"aaa", ids("aa", "a")},           // ties go to the leftmost pair
		{"aaaa", ids("aa", "aa")},
	}
	for _, tt := range tests {
		if got := tok.Encode(tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestPieceCache(t *testing.T) {
	tok := testTokenizer(t, "small")
	text := strings.Repeat("tokenizers merge neighbouring bytes ", 50)
	e := newEncoder(tok)
	e.ordinary(text)
	if len(e.cache) == 0 || len(e.cache) > 10 {
		t.Errorf("cache holds %d pieces for a text of 4 distinct words", len(e.cache))
	}
	if want := tok.Encode(text); !reflect.DeepEqual(e.out, want) {
		t.Errorf("cached encoding differs from a fresh one")
	}
}
