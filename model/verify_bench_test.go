package model_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// BenchmarkVerifyStep is the cost curve of speculative decoding's verify
// step on the small preset: one sequence at 256 tokens of context takes its
// last token and k drafts (k = 1..4) in one decode step, and all of them are
// committed (the KDA layers roll forward over every row: the dearest
// commit), set against a plain one-row decode step in the same run
// (k=N/decode; the target is at most 1 + 0.3k). Each measurement
// starts from a copy of the same state (the copy is not timed).
//
//	go test ./model -run '^$' -bench VerifyStep -benchtime 10x
func BenchmarkVerifyStep(b *testing.B) {
	const kMax = 4
	dir := testmodel.Dir(b, "small", 1, 2)
	m, err := model.Load(dir, cpu.New(0), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	V := m.Cfg.VocabSize
	base := m.NewState(0, m.Cfg.NumLayers)
	if err := m.PrefillState(ctx, []*model.SeqState{base}, [][]int32{testkit.Prompt(256, V, 1)}); err != nil {
		b.Fatal(err)
	}
	toks := testkit.Prompt(kMax+1, V, 2)
	var spent [kMax + 1]time.Duration
	for b.Loop() {
		for k := 0; k <= kMax; k++ {
			s := base.Clone()
			t0 := time.Now()
			if k == 0 {
				_, err = m.Decode(ctx, []*model.SeqState{s}, toks[:1])
			} else if _, err = m.Verify(ctx, []*model.SeqState{s}, [][]int32{toks[:1+k]}); err == nil {
				err = m.Commit(s, 1+k)
			}
			spent[k] += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(spent[0].Milliseconds())/float64(b.N), "decode-ms")
	for k := 1; k <= kMax; k++ {
		b.ReportMetric(float64(spent[k])/float64(spent[0]), fmt.Sprintf("k=%d/decode", k))
	}
}
