package grammar_test

import (
	"bytes"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/internal/schemacheck"
	"github.com/tandem-inference/tandem/tokenizer"
)

type testVocab struct {
	tok *tokenizer.Tokenizer
	v   *grammar.Vocabulary
}

var vocabs sync.Map // size -> *testVocab

// vocab returns a synthetic tokenizer of size ids and its Vocabulary.
func vocab(tb testing.TB, size int) *testVocab {
	tb.Helper()
	if tv, ok := vocabs.Load(size); ok {
		return tv.(*testVocab)
	}
	dir := filepath.Join(tb.TempDir(), "tok")
	if err := tokenizer.WriteSynthetic(dir, size, nil); err != nil {
		tb.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		tb.Fatal(err)
	}
	v, err := tok.GrammarVocabulary()
	if err != nil {
		tb.Fatal(err)
	}
	tv := &testVocab{tok, v}
	vocabs.Store(size, tv)
	return tv
}

func (tv *testVocab) id(name string) int {
	id, _ := tv.tok.SpecialID(name)
	return id
}

func allowedIDs(mask []uint64, n int) []int {
	var out []int
	for id := range n {
		if grammar.Allowed(mask, id) {
			out = append(out, id)
		}
	}
	return out
}

// walk generates a reply choosing among the masked tokens at random: a
// third of the time among the markers allowed, a third among the allowed
// tokens holding a JSON closer, else among all allowed (so that strings
// end). It returns the ids, the last <|end_of_msg|>.
func walk(tb testing.TB, tv *testVocab, g *grammar.Grammar, seed uint64, limit int) []int {
	tb.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	m := g.NewMatcher(tv.v)
	mask := make([]uint64, tv.v.MaskWords())
	var ids []int
	for step := 0; ; step++ {
		if step > limit {
			tb.Fatalf("seed %d: no end after %d tokens: %q", seed, limit, decode(tv, ids))
		}
		if err := m.Mask(mask); err != nil {
			tb.Fatal(err)
		}
		all := allowedIDs(mask, tv.v.Size())
		if len(all) == 0 {
			tb.Fatalf("seed %d: empty mask after %q", seed, decode(tv, ids))
		}
		var markers, closers []int
		for _, id := range all {
			if tv.tok.IsSpecial(id) {
				markers = append(markers, id)
			} else if bytes.ContainsAny(tv.tok.TokenBytes(id), `"]},`) {
				closers = append(closers, id)
			}
		}
		pool := all
		switch r := rng.IntN(3); {
		case r == 0 && len(markers) > 0:
			pool = markers
		case r == 1 && len(closers) > 0:
			pool = closers
		}
		id := pool[rng.IntN(len(pool))]
		if err := m.Accept(id); err != nil {
			tb.Fatalf("seed %d: Accept of a masked id %d: %v", seed, id, err)
		}
		ids = append(ids, id)
		if id == tv.id(tokenizer.EndOfMsg) {
			if !m.Done() {
				tb.Fatalf("seed %d: not done after <|end_of_msg|>", seed)
			}
			return ids
		}
	}
}

func decode(tv *testVocab, ids []int) string {
	s, _ := tv.tok.DecodeString(ids)
	return s
}

type call struct {
	name string
	args strings.Builder
}

// parse reads ids as the reply to a prompt that opened it (thinking or
// not) and returns the calls and the content.
func parse(tb testing.TB, tv *testVocab, ids []int, thinking bool) ([]*call, string) {
	tb.Helper()
	p := tv.tok.NewReplyParser(tokenizer.ReplyOptions{Thinking: thinking, Tools: true})
	var calls []*call
	var content strings.Builder
	for _, id := range ids {
		d := p.Push(id)
		content.WriteString(d.Content)
		if d.Call >= 0 {
			if d.Start {
				calls = append(calls, &call{name: d.Name})
			}
			calls[d.Call].args.WriteString(d.Arguments)
		}
	}
	d := p.Finish()
	content.WriteString(d.Content)
	if p.Malformed() || !p.Done() || p.Closed() != p.Calls() {
		tb.Fatalf("malformed reply (done %v, %d/%d calls closed): %q", p.Done(), p.Closed(), p.Calls(), decode(tv, ids))
	}
	return calls, content.String()
}

func decodeJSON(tb testing.TB, s string) any {
	tb.Helper()
	v, err := schemacheck.Decode(s)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

var validate = schemacheck.Validate
