package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
)

// benchText is about n bytes of the bundled corpus's paragraphs in a seeded
// order with random numbers between them.
func benchText(n int) string {
	paras := strings.Split(string(DefaultCorpus()), "\n\n")
	rng := rand.New(rand.NewPCG(3, 5))
	var sb strings.Builder
	for sb.Len() < n {
		sb.WriteString(paras[rng.IntN(len(paras))])
		fmt.Fprintf(&sb, " %d id_%x\n\n", rng.IntN(1_000_000), rng.Uint64())
	}
	return sb.String()
}

func BenchmarkEncode1MB(b *testing.B) {
	tok := testTokenizer(b, "k3")
	text := benchText(1 << 20)
	tok.Encode(text)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text)
	}
}

func BenchmarkLoadRealSize(b *testing.B) {
	testTokenizer(b, "k3")
	dir, err := goldenModels()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Load(filepath.Join(dir, "k3")); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStreamDecode(b *testing.B) {
	tok := testTokenizer(b, "k3")
	text := benchText(64 << 10)
	ids := tok.Encode(text)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		d := NewStreamDecoder(tok)
		for _, id := range ids {
			if _, err := d.Push(id); err != nil {
				b.Fatal(err)
			}
		}
		d.Flush()
	}
}
