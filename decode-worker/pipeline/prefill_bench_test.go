package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
)

// BenchmarkLocalPrefillPriced prefills prompts of 64, 256 and 1024 tokens
// twice, then 2048 and 4096, one at a time, on a group of two ranks (small preset,
// one thread each, chunks of 512), and prices each prompt before it runs
// as the router does: the cost model fitted to the group's samples so far
// (its ranks' compute, the attention timed apart), the chunks flowing
// through the ranks' layers. It reports per prompt length the measured
// over predicted prefill (pred@N, from the second 256-token prompt on,
// each priced from the samples before it), the wall time over the ranks' summed compute
// (wall/compute@N: how much the ranks overlap the chunks), and the rates
// of the attention and of the rest of the compute (GFLOP/s). Run it on a
// quiet machine with -benchtime 1x; it takes about 90 s.
func BenchmarkLocalPrefillPriced(b *testing.B) {
	dir := testmodel.Dir(b, "small", 1, 0)
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	g := startGroup(ctx, b, dir, 512)
	cm := costmodel.New(&cfg.Config, 2)
	var stages []costmodel.Stage
	for _, r := range g.Layout.Ranks {
		stages = append(stages, costmodel.Stage{First: r.Lo, End: r.Hi})
	}
	c := group.NewCollector()
	for i := 0; i < b.N; i++ {
		var samples []costmodel.Sample
		for k, n := range []int{64, 256, 1024, 64, 256, 1024, 2048, 4096} {
			id := fmt.Sprintf("b%d-%d", i, k)
			if err := g.Head().Submit(ctx, pipeline.Request{ID: id, Tokens: testkit.Prompt(n, cfg.VocabSize, k), MaxTokens: 1, Sink: c}); err != nil {
				b.Fatal(err)
			}
			_, res, err := c.Wait(ctx, id)
			if err != nil {
				b.Fatal(err)
			}
			tm := res.Timing
			wall := tm.FirstToken.Sub(tm.Ready).Seconds()
			w := cm.Work(0, n-1)
			if k >= 3 {
				b.ReportMetric(wall/tm.PrefillCompute.Seconds(), fmt.Sprintf("wall/compute@%d", n))
				b.ReportMetric(w.Attn/tm.PrefillAttention.Seconds()/1e9, fmt.Sprintf("attn-GFLOP/s@%d", n))
				b.ReportMetric((w.Total()-w.Attn)/(tm.PrefillCompute-tm.PrefillAttention).Seconds()/1e9, fmt.Sprintf("rest-GFLOP/s@%d", n))
			}
			if k >= 4 {
				// Priced from the group's samples so far, the first (cold)
				// one left out as the workers' fitter does.
				f, _, err := costmodel.Fit(costmodel.Compute{}, samples[1:])
				if err != nil {
					b.Fatal(err)
				}
				p := costmodel.PredictLocal(cm, costmodel.Rates{Local: f}, costmodel.Load{LocalChunk: 512, LocalStages: stages}, n)
				b.ReportMetric(wall/p.Prefill.Seconds(), fmt.Sprintf("pred@%d", n))
			}
			samples = append(samples, costmodel.Sample{Work: w, Calls: (n - 1 + 511) / 512 * cm.Layers,
				Took: tm.PrefillCompute, Attention: tm.PrefillAttention})
		}
	}
}
