package tokenizer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteSyntheticTooSmall(t *testing.T) {
	for _, v := range []int{0, 256, 512, MinSyntheticVocab - 1} {
		err := WriteSynthetic(t.TempDir(), v, nil)
		if !errors.Is(err, ErrVocabTooSmall) || !strings.Contains(err.Error(), "need at least 576") {
			t.Errorf("vocab %d: err = %v", v, err)
		}
	}
}

func TestWriteSynthetic(t *testing.T) {
	dir := t.TempDir()
	const vocab = 4096
	corpus := []byte(strings.Repeat("the cat sat on the mat with the other cat. ", 20))
	if err := WriteSynthetic(dir, vocab, corpus); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != vocab {
		t.Fatalf("VocabSize = %d, want %d", tok.VocabSize(), vocab)
	}
	for _, s := range k3Specials {
		if id, ok := tok.SpecialID(s.name); !ok || id != vocab-NumSpecial+s.offset {
			t.Errorf("%s at %d, want %d", s.name, id, vocab-NumSpecial+s.offset)
		}
	}
	// Merges learned from the corpus come first: " cat" is frequent.
	if r, ok := tok.v.rank[" cat"]; !ok || r > 300 {
		t.Errorf(`" cat" has rank %d (present %v), want an early merge`, r, ok)
	}
	if got := tok.Encode(" the cat"); len(got) != 2 {
		t.Errorf(`" the cat" encodes to %d tokens, want 2`, len(got))
	}
	// Every id decodes; the ranks past the corpus are merges of two
	// earlier tokens.
	for id := range tok.VocabSize() {
		if _, err := tok.Decode([]int{id}); err != nil {
			t.Fatal(err)
		}
	}
	for r := 256; r < tok.NumRanks(); r++ {
		b := tok.v.bytes(r)
		ok := false
		for k := 1; k < len(b) && !ok; k++ {
			r1, ok1 := tok.v.rank[string(b[:k])]
			r2, ok2 := tok.v.rank[string(b[k:])]
			ok = ok1 && ok2 && r1 < r && r2 < r
		}
		if !ok {
			t.Fatalf("rank %d (%q) is not a merge of two lower ranks", r, b)
		}
	}

	// The same inputs give the same bytes.
	dir2 := t.TempDir()
	if err := WriteSynthetic(dir2, vocab, corpus); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ModelFile, ConfigFile} {
		a, _ := os.ReadFile(filepath.Join(dir, f))
		b, _ := os.ReadFile(filepath.Join(dir2, f))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two writes", f)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("dir holds %d files, want 2 (no temporary files left)", len(entries))
	}
}

// TestRealSizeRankFile loads a rank file of the released size (163,584
// ranks) and encodes with it.
func TestRealSizeRankFile(t *testing.T) {
	tok := testTokenizer(t, "k3")
	if tok.NumRanks() <= 100_000 {
		t.Fatalf("only %d ranks", tok.NumRanks())
	}
	text := string(DefaultCorpus())
	got, err := tok.DecodeString(tok.Encode(text))
	if err != nil || got != text {
		t.Fatalf("round trip failed: %v", err)
	}
}
