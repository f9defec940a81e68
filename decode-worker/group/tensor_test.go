package group

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestTensorGroupsMatchMonolithic: groups whose stages are split over
// tensor ranks (pipeline x tensor: 1x2 and 2x2 of the tiny preset, 1x3 of
// the small one, whose heads 3 divides) generate the monolithic model's
// greedy ids for prompts they prefill themselves, several sequences
// batched in one step, and free every sequence on every rank.
func TestTensorGroupsMatchMonolithic(t *testing.T) {
	for _, l := range []struct {
		preset           string
		pipeline, tensor int
	}{{"tiny", 1, 2}, {"tiny", 2, 2}, {"small", 1, 3}} {
		t.Run(fmt.Sprintf("%s-%dx%d", l.preset, l.pipeline, l.tensor), func(t *testing.T) {
			prompts := [][]int32{{5, 17, 200, 33, 4, 250}, {9, 8, 7}, {100, 101, 102, 103, 104, 105, 106, 107, 108}}
			n := 24
			if l.preset == "small" {
				if testing.Short() {
					t.Skip("the small preset: skipped in -short mode (the model's own split tests cover 1x3)")
				}
				prompts, n = prompts[:2], 12
			}
			dir := testmodel.Dir(t, l.preset, 1, 2)
			ref := testmodel.LoadReference(t, dir, 0)
			var want [][]int32
			for _, p := range prompts {
				want = append(want, ref.Greedy(t, p, n))
			}
			opt := fastOpts(dir, l.pipeline*l.tensor)
			opt.Tensor = l.tensor
			g := startGroup(t, opt)
			ctx := testctx.Context(t)
			got := make([][]int32, len(prompts))
			errs := make(chan error, len(prompts))
			for i, p := range prompts {
				go func() {
					var err error
					got[i], err = g.Generate(ctx, fmt.Sprint("s", i), p, n)
					errs <- err
				}()
			}
			for range prompts {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for i := range prompts {
				if !slices.Equal(got[i], want[i]) {
					t.Fatalf("prompt %d, %dx%d: %v\nmonolithic: %v", i, l.pipeline, l.tensor, got[i], want[i])
				}
			}
			g.checkFreed(t)
		})
	}
}

// TestTensorGroupPaths: a 2 x 2 group (two stages of two tensor ranks)
// gives the monolithic model's tokens on the paths that touch a rank's
// state or its draws: a prompt resumed from the prefix cache (each rank
// keeps its own slice of the state), seeded sampling (every rank of the
// last stage draws alike from the gathered logits), a cancel mid-decode,
// speculative decoding with drafts that carry planted errors (every rank
// of the last stage verifies alike), and an image prompt (the head's
// embedding, the features in place, goes to its stage's other rank).
func TestTensorGroupPaths(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	const n = 8
	opt := fastOpts(dir, 4)
	opt.Tensor, opt.PrefillChunk = 2, 64
	t.Run("cache, sampling, cancel", func(t *testing.T) {
		g := startGroup(t, opt)
		ctx := testctx.Context(t)
		p1 := testkit.Prompt(150, vocab, 1)
		out1 := ref.Greedy(t, p1, n)
		p2 := concat(p1, out1, testkit.Prompt(40, vocab, 2))
		for i, p := range [][]int32{p1, p2} {
			got, err := g.Generate(ctx, name("turn%d", i), p, n)
			if want := ref.Greedy(t, p, n); err != nil || !slices.Equal(got, want) {
				t.Fatalf("turn %d: %v %v\nmonolithic: %v", i, got, err, want)
			}
		}
		g.waitCache(t, 0, "hit tokens", func(s prefixcache.Stats) bool { return s.HitTokens == 128 })
		for r := range 4 {
			g.waitCache(t, r, "the turn's entry", func(s prefixcache.Stats) bool { return s.Inserts == 2 && s.Entries == 1 })
		}
		// The tensor ranks of a stage keep slices of equal size.
		if a, b := g.Worker(2).Stats().Cache, g.Worker(3).Stats().Cache; a.Bytes != b.Bytes || a.Bytes == 0 {
			t.Fatalf("stage 1's ranks cache %d and %d bytes", a.Bytes, b.Bytes)
		}

		c := NewCollector()
		sp := sampling.Params{Temperature: 0.8, TopK: 40, Seed: 7}
		if err := g.Head().Submit(ctx, pipeline.Request{ID: "sampled", Tokens: p1, MaxTokens: 12, Sampling: sp, Sink: c}); err != nil {
			t.Fatal(err)
		}
		if got, _, err := c.Wait(ctx, "sampled"); err != nil || !slices.Equal(got, sampled(t, ref, p1, 12, sp)) {
			t.Fatalf("sampled: %v %v\nmonolithic: %v", got, err, sampled(t, ref, p1, 12, sp))
		}
		if err := g.Head().Submit(ctx, pipeline.Request{ID: "long", Tokens: p2, MaxTokens: 100000, Sink: c}); err != nil {
			t.Fatal(err)
		}
		waitTokens(t, c, "long", 3)
		if err := g.Head().Cancel(ctx, "long"); err != nil {
			t.Fatal(err)
		}
		if got, res, err := c.Wait(ctx, "long"); err != nil || res.Reason != pipeline.ReasonCancelled || !slices.Equal(got[:3], ref.Greedy(t, p2, 3)) {
			t.Fatalf("cancelled: %v %v %+v", got, err, res)
		}
		g.checkFreed(t)
	})
	t.Run("images", func(t *testing.T) {
		seeds := []uint64{1, 2}
		p, media := testmodel.ImagePrompt(ref.Cfg, []int{30, 20, 5}, []int{40, 24}, seeds)
		want, err := ref.GenerateMedia(context.Background(), p, media, n)
		if err != nil {
			t.Fatal(err)
		}
		g := startGroup(t, opt)
		ctx := testctx.Context(t)
		var calls atomic.Int32
		c := NewCollector()
		if err := g.Head().Submit(ctx, pipeline.Request{ID: "image", Tokens: p, MaxTokens: n, Sink: c,
			Images: images(media, ref.Cfg.HiddenSize, seeds), Encode: encoder(media, &calls)}); err != nil {
			t.Fatal(err)
		}
		if got, _, err := c.Wait(ctx, "image"); err != nil || !slices.Equal(got, want) {
			t.Fatalf("image prompt: %v %v\nmonolithic: %v", got, err, want)
		}
		g.checkFreed(t)
	})
	t.Run("drafts", func(t *testing.T) {
		prompts := speculationPrompts(vocab)
		want := make([][]int32, len(prompts))
		for i, p := range prompts {
			want[i] = ref.Greedy(t, p, 24)
		}
		opt := opt
		opt.Draft = pipeline.DraftConfig{Fixed: true, KMax: 4, Drafter: &forced{prompts: prompts, conts: want, vocab: int32(vocab)}}
		g := startGroup(t, opt)
		ctx := testctx.Context(t)
		c := NewCollector()
		for i, p := range prompts {
			if err := g.Head().Submit(ctx, pipeline.Request{ID: name("s%d", i), Tokens: p, MaxTokens: 24, Sink: c}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range prompts {
			if got, _, err := c.Wait(ctx, name("s%d", i)); err != nil || !slices.Equal(got, want[i]) {
				t.Fatalf("s%d: %v %v\nmonolithic: %v", i, got, err, want[i])
			}
		}
		if st := g.Head().Stats(); st.AcceptedTokens == 0 || st.AcceptedTokens == st.DraftedTokens {
			t.Fatalf("drafted %d, accepted %d: the drafts were not both kept and refused", st.DraftedTokens, st.AcceptedTokens)
		}
		g.checkFreed(t)
	})
}
