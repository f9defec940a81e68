package pipeline_test

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
)

// TestPrefillAttentionTimed: a prompt prefilled in several steps on a
// group of two ranks, each holding MLA layers, reports the time its
// prefill steps spent in the MLA attention on both ranks: some, and less
// than its whole prefill. A prompt that prefilled nothing (one token: its
// only step is a decode step) reports none.
func TestPrefillAttentionTimed(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 0)
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testctx.Context(t)
	g := startGroup(ctx, t, dir, 128)
	for r, spec := range g.Layout.Ranks {
		n := 0
		for L := spec.Lo; L < spec.Hi; L++ {
			if cfg.LayerKind(L) == model.MLA {
				n++
			}
		}
		if n == 0 {
			t.Fatalf("rank %d holds no MLA layer in [%d, %d): the test cannot see the ranks' shares add up", r, spec.Lo, spec.Hi)
		}
	}
	c := group.NewCollector()
	for _, tc := range []struct {
		id     string
		tokens []int32
	}{{"long", testkit.Prompt(400, cfg.VocabSize, 1)}, {"one", testkit.Prompt(1, cfg.VocabSize, 2)}} {
		if err := g.Head().Submit(ctx, pipeline.Request{ID: tc.id, Tokens: tc.tokens, MaxTokens: 2, Sink: c}); err != nil {
			t.Fatal(err)
		}
		_, res, err := c.Wait(ctx, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		tm := res.Timing
		prefill := tm.FirstToken.Sub(tm.Ready)
		t.Logf("%s: %v of attention in a prefill of %v", tc.id, tm.PrefillAttention, prefill)
		switch {
		case len(tc.tokens) == 1 && tm.PrefillAttention != 0:
			t.Errorf("%s: %v of prefill attention for a prompt with nothing to prefill", tc.id, tm.PrefillAttention)
		case len(tc.tokens) > 1 && !(tm.PrefillAttention > 0 && tm.PrefillAttention < prefill):
			t.Errorf("%s: %v of prefill attention in a prefill of %v", tc.id, tm.PrefillAttention, prefill)
		}
		// The steps it ran in: its chunks, cut at the cache's snapshot
		// (the group's cache is on, stride 0).
		end := len(tc.tokens) - 1
		if want := len(costmodel.LocalSteps(0, end, 128, prefixcache.Snapshots(0, end, 0))); tm.PrefillSteps != want {
			t.Errorf("%s: %d prefill steps counted, want %d", tc.id, tm.PrefillSteps, want)
		}
		if tc.id != "long" {
			continue
		}
		// Every rank's share reached the head: the first prompt's
		// attention is the ranks' own counts added up (once each has
		// published its count of the prompt's last prefill step).
		ranks := func() (sum time.Duration, each []time.Duration) {
			for r := range g.Layout.Ranks {
				d := g.Worker(r).Stats().PrefillAttention
				sum, each = sum+d, append(each, d)
			}
			return sum, each
		}
		testkit.WaitFor(ctx, t, "the ranks' counts of the prompt's attention", func() bool { s, _ := ranks(); return s >= tm.PrefillAttention })
		if s, each := ranks(); s != tm.PrefillAttention || slices.Contains(each, 0) {
			t.Errorf("%s: the head counted %v of attention, the ranks %v (%v)", tc.id, tm.PrefillAttention, each, s)
		}
	}
}
