package group

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tandem-inference/tandem/internal/testctx"
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
			dir := testmodel.Dir(t, l.preset, 1, 2)
			ref := testmodel.LoadReference(t, dir, 0)
			prompts := [][]int32{{5, 17, 200, 33, 4, 250}, {9, 8, 7}, {100, 101, 102, 103, 104, 105, 106, 107, 108}}
			const n = 24
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
