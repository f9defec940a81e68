package tokenizer

import (
	"path/filepath"
	"sync"
	"testing"
)

var testToks sync.Map // model name -> *Tokenizer

// testTokenizer returns the synthetic tokenizer of the golden manifest with
// the given name ("small": 2,048 ids, "k3": 163,840 ids).
func testTokenizer(t testing.TB, name string) *Tokenizer {
	t.Helper()
	if tok, ok := testToks.Load(name); ok {
		return tok.(*Tokenizer)
	}
	dir, err := goldenModels()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Load(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	testToks.Store(name, tok)
	return tok
}

// pieces returns the pre-split pieces of s after the wrapper's cuts.
func pieces(s string) []string {
	var out []string
	kimiCuts.cut(toValidString(s), func(p string) {
		splitPieces(p, func(piece string) { out = append(out, piece) })
	})
	return out
}
