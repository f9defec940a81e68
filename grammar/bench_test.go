package grammar_test

import (
	"testing"

	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/tokenizer"
)

// BenchmarkMask measures one mask over K3's vocabulary (163,840 ids): cold
// (a fresh Grammar: the automaton's states and the trie walk) and warm (the
// state's mask cached), in the think channel (every ordinary token
// allowed) and inside an element head (few allowed).
func BenchmarkMask(b *testing.B) {
	tv := vocab(b, 163840)
	spec := &grammar.Spec{Mode: grammar.ModeToolCall, Tools: testTools, Thinking: true}
	head := []int{tv.id(tokenizer.Close)}
	head = append(head, tv.tok.Encode("think")...)
	head = append(head, tv.id(tokenizer.Sep), tv.id(tokenizer.Open))
	head = append(head, tv.tok.Encode("response")...)
	head = append(head, tv.id(tokenizer.Sep), tv.id(tokenizer.Close))
	head = append(head, tv.tok.Encode("response")...)
	head = append(head, tv.id(tokenizer.Sep), tv.id(tokenizer.Open))
	head = append(head, tv.tok.Encode("tools")...)
	head = append(head, tv.id(tokenizer.Sep), tv.id(tokenizer.Open))
	head = append(head, tv.tok.Encode(`call tool="get`)...)
	mask := make([]uint64, tv.v.MaskWords())
	for _, at := range []struct {
		name string
		ids  []int
	}{{"think", nil}, {"head", head}} {
		matcher := func(g *grammar.Grammar) *grammar.Matcher {
			m := g.NewMatcher(tv.v)
			for _, id := range at.ids {
				if err := m.Accept(id); err != nil {
					b.Fatal(err)
				}
			}
			return m
		}
		b.Run(at.name+"/cold", func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				g, err := grammar.Compile(spec)
				if err != nil {
					b.Fatal(err)
				}
				m := matcher(g)
				b.StartTimer()
				if err := m.Mask(mask); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(at.name+"/warm", func(b *testing.B) {
			g, _ := grammar.Compile(spec)
			m := matcher(g)
			m.Mask(mask)
			for b.Loop() {
				if err := m.Mask(mask); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
