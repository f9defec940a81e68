package group

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// BenchmarkDecode measures the aggregate decode rate of 1, 4 and 8
// sequences on groups of 1 to 3 ranks (tiny model, in process, mesh over
// loopback TCP): each iteration submits the sequences at once and generates
// 16 tokens for every one.
// It reports tok/s and the head's per-step round trip, compute and mesh
// time; compare sub-benchmarks of the same run, e.g.
//
//	go test ./decode-worker/group -run '^$' -bench Decode
func BenchmarkDecode(b *testing.B) {
	dir := testmodel.Dir(b, "tiny", 1, 2)
	const tokens = 16
	for ranks := 1; ranks <= 3; ranks++ {
		for _, seqs := range []int{1, 4, 8} {
			b.Run(fmt.Sprintf("ranks=%d/seqs=%d", ranks, seqs), func(b *testing.B) {
				ctx := context.Background()
				g, err := Start(ctx, Options{ModelDir: dir, Ranks: ranks})
				if err != nil {
					b.Fatal(err)
				}
				defer g.Close()
				vocab := g.Model(0).Cfg.VocabSize
				before := g.Head().Stats()
				n := 0
				start := time.Now()
				for b.Loop() {
					c := NewCollector()
					errs := make(chan error, seqs)
					for i := 0; i < seqs; i++ {
						req := pipeline.Request{ID: fmt.Sprintf("b%d-%d", n, i), Tokens: testkit.Prompt(8, vocab, i), MaxTokens: tokens, Sink: c}
						go func() { errs <- g.Head().Submit(ctx, req) }()
					}
					for i := 0; i < seqs; i++ {
						if err := <-errs; err != nil {
							b.Fatal(err)
						}
					}
					for i := 0; i < seqs; i++ {
						if _, _, err := c.Wait(ctx, fmt.Sprintf("b%d-%d", n, i)); err != nil {
							b.Fatal(err)
						}
					}
					n++
				}
				el := time.Since(start)
				after := g.Head().Stats()
				b.ReportMetric(float64(n*seqs*tokens)/el.Seconds(), "tok/s")
				if steps := after.DecodeSteps - before.DecodeSteps; steps > 0 {
					per := func(d time.Duration) float64 { return float64(d) / float64(steps) / 1e6 }
					b.ReportMetric(per(after.StepTime-before.StepTime), "ms/step")
					b.ReportMetric(per(after.StepComputeTime-before.StepComputeTime), "compute-ms/step")
					b.ReportMetric(per(after.StepMeshTime-before.StepMeshTime), "mesh-ms/step")
				}
			})
		}
	}
}
