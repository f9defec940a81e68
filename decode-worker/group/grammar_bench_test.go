package group

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// BenchmarkGrammarDecode measures what drawing within a grammar costs a
// decode step at batch 16: 16 sequences with a tool-call grammar decode
// together (demo model, 1 rank, temperature 1), and the last rank's time
// in their draws (masks, masked sampling, matchers) is set against the
// step time of the same run (grammar/step, the ratio). The k3-vocab part
// runs the same per-step work for 16 sequences over K3's vocabulary
// (163,840 ids, synthetic tokenizer, random logits), plain draws against
// masked ones:
//
//	go test ./decode-worker/group -run '^$' -bench GrammarDecode -benchtime 3x
func BenchmarkGrammarDecode(b *testing.B) {
	const seqs, tokens = 16, 48
	b.Run("demo/seqs=16", func(b *testing.B) {
		dir := testmodel.Dir(b, "demo", 1, 2)
		tok, err := tokenizer.Load(dir)
		if err != nil {
			b.Fatal(err)
		}
		chat := grammarChat(false)
		spec, err := chat.Constraint(0)
		if err != nil {
			b.Fatal(err)
		}
		ids, _ := tok.EncodeChat(chat)
		prompt := make([]int32, len(ids))
		for i, id := range ids {
			prompt[i] = int32(id)
		}
		ctx := context.Background()
		g, err := Start(ctx, Options{ModelDir: dir, Ranks: 1, MaxBatch: seqs})
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		before := g.Head().Stats()
		n := 0
		for b.Loop() {
			c := NewCollector()
			errs := make(chan error, seqs)
			for i := range seqs {
				req := pipeline.Request{ID: fmt.Sprintf("b%d-%d", n, i), Tokens: prompt, MaxTokens: tokens, Grammar: spec, Sink: c,
					Sampling: sampling.Params{Temperature: 1, Seed: uint64(n*seqs + i)}}
				go func() { errs <- g.Head().Submit(ctx, req) }()
			}
			for range seqs {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			for i := range seqs {
				if _, _, err := c.Wait(ctx, fmt.Sprintf("b%d-%d", n, i)); err != nil {
					b.Fatal(err)
				}
			}
			n++
		}
		after := g.Head().Stats()
		steps := after.DecodeSteps - before.DecodeSteps
		if steps == 0 {
			return
		}
		step := float64(after.StepTime-before.StepTime) / float64(steps) / 1e6
		gram := float64(after.GrammarTime-before.GrammarTime) / float64(steps) / 1e6
		b.ReportMetric(step, "ms/step")
		b.ReportMetric(gram, "grammar-ms/step")
		b.ReportMetric(gram/step, "grammar/step")
		b.ReportMetric(float64(after.DecodeRows-before.DecodeRows)/float64(steps), "seqs/step")
	})
	b.Run("k3-vocab/seqs=16", func(b *testing.B) {
		dir := filepath.Join(b.TempDir(), "k3tok")
		if err := tokenizer.WriteSynthetic(dir, 163840, nil); err != nil {
			b.Fatal(err)
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			b.Fatal(err)
		}
		v, err := tok.GrammarVocabulary()
		if err != nil {
			b.Fatal(err)
		}
		spec, _ := grammarChat(false).Constraint(0)
		gr, err := grammar.Compile(spec)
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		logits := make([][]float32, seqs)
		for i := range logits {
			logits[i] = make([]float32, v.Size())
			for j := range logits[i] {
				logits[i][j] = float32(rng.NormFloat64() * 3)
			}
		}
		type seq struct {
			m     *grammar.Matcher
			s     *sampling.Sampler
			plain *sampling.Sampler
			mask  []uint64
		}
		fresh := func(i, n int) *seq {
			p := sampling.Params{Temperature: 1, Seed: uint64(n*seqs + i)}
			s, _ := sampling.New(p)
			plain, _ := sampling.New(p)
			return &seq{m: gr.NewMatcher(v), s: s, plain: plain, mask: make([]uint64, v.MaskWords())}
		}
		ss := make([]*seq, seqs)
		for i := range ss {
			ss[i] = fresh(i, 0)
		}
		var plainTime, maskedTime time.Duration
		steps := 0
		for b.Loop() {
			t0 := time.Now()
			for i, s := range ss {
				if _, err := s.plain.Sample(logits[i]); err != nil {
					b.Fatal(err)
				}
			}
			t1 := time.Now()
			for i, s := range ss {
				if err := s.m.Mask(s.mask); err != nil {
					b.Fatal(err)
				}
				id, err := s.s.SampleMasked(logits[i], s.mask)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.m.Accept(int(id)); err != nil {
					b.Fatal(err)
				}
				if s.m.Ended() {
					ss[i] = fresh(i, steps+1)
				}
			}
			maskedTime += time.Since(t1)
			plainTime += t1.Sub(t0)
			steps++
		}
		b.ReportMetric(float64(plainTime)/float64(steps)/1e6, "plain-ms/step")
		b.ReportMetric(float64(maskedTime)/float64(steps)/1e6, "grammar-ms/step")
	})
}
