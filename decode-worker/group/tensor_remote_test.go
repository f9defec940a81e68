package group

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
)

// TestTensorGroupsDecodeRemoteStates: remotely prefilled sequences,
// shipped to each tensor rank as its slice (the KDA heads it holds, the
// MLA rows whole), decode to the same greedy ids on a 1x2 and a 2x2 group
// as on a one-rank group and the monolithic model; each rank receives
// exactly its slices' bytes, a tensor rank less than its stage's whole.
func TestTensorGroupsDecodeRemoteStates(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	const n = 16
	prompts := [][]int32{testkit.Prompt(40, ref.Cfg.VocabSize, 3), testkit.Prompt(7, ref.Cfg.VocabSize, 4), testkit.Prompt(130, ref.Cfg.VocabSize, 5)}
	var want [][]int32
	for _, p := range prompts {
		want = append(want, ref.Greedy(t, p, n))
	}
	for _, l := range []struct{ pipeline, tensor int }{{1, 1}, {1, 2}, {2, 2}} {
		t.Run(fmt.Sprintf("%dx%d", l.pipeline, l.tensor), func(t *testing.T) {
			opt := fastOpts(dir, l.pipeline*l.tensor)
			opt.Tensor = l.tensor
			g := startGroup(t, opt)
			ctx := testctx.Context(t)
			c := NewCollector()
			wantBytes := make([]int64, len(g.Layout.Ranks))
			for i, p := range prompts {
				id := name("r%d", i)
				if err := g.Head().Submit(ctx, pipeline.Request{ID: id, Tokens: p[len(p)-1:], MaxTokens: n, Remote: g.remote("x-"+id, len(p)-1), Sink: c}); err != nil {
					t.Fatal(err)
				}
				st := ref.RemoteState(t, p)
				for r, s := range g.Layout.Ranks {
					slice, err := ref.Cfg.ShardSeqState(st, g.Layout.Shard(r))
					if err != nil {
						t.Fatal(err)
					}
					for L := s.Lo; L < s.Hi; L++ {
						wantBytes[r] += int64(slice.Layers[L].Bytes())
					}
				}
				if err := g.send(ctx, st, "x-"+id); err != nil {
					t.Fatal(err)
				}
			}
			for i := range prompts {
				got, res, err := c.Wait(ctx, name("r%d", i))
				if err != nil || res.Reason != pipeline.ReasonLength {
					t.Fatalf("r%d: %v, %+v", i, err, res)
				}
				if !slices.Equal(got, want[i]) {
					t.Fatalf("r%d (prompt of %d) on %dx%d: %v\nmonolithic: %v", i, len(prompts[i]), l.pipeline, l.tensor, got, want[i])
				}
			}
			for r := range g.Layout.Ranks {
				if got := g.Server(r).Stats().BytesVerified; got != wantBytes[r] {
					t.Errorf("rank %d (%s) received %d bytes, its slices hold %d", r, g.Layout.Shard(r), got, wantBytes[r])
				}
			}
			g.checkFreed(t)
		})
	}
}

// wholeToStage is the placement of a sender that ignores tensor ranks: it
// sends each layer whole to every rank of the layer's stage.
type wholeToStage struct{ g *Group }

func (p wholeToStage) Routes(L int, _ model.PartKind, size int, _ []int) ([]kvtransfer.Route, error) {
	var out []kvtransfer.Route
	for _, s := range p.g.Layout.Ranks {
		if L >= s.Lo && L < s.Hi {
			out = append(out, kvtransfer.Route{Endpoint: s.Endpoint, Len: size})
		}
	}
	return out, nil
}

func (p wholeToStage) Endpoints() []string {
	var out []string
	for _, s := range p.g.Layout.Ranks {
		out = append(out, s.Endpoint)
	}
	return out
}

// TestTensorRankRefusesWholeState: a tensor rank sent the whole state of
// its layers instead of its slice refuses it; the sequence ends with an
// error naming the rank, its slice and the shapes or sizes, nothing is
// decoded, every rank frees it, and the group still serves.
func TestTensorRankRefusesWholeState(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	opt := fastOpts(dir, 2)
	opt.Tensor = 2
	g := startGroup(t, opt)
	ctx := testctx.Context(t)
	c := NewCollector()
	p := testkit.Prompt(20, ref.Cfg.VocabSize, 6)
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "whole", Tokens: p[19:], MaxTokens: 4, Remote: g.remote("x-whole", 19), Sink: c}); err != nil {
		t.Fatal(err)
	}
	// The transfer fails once a rank refused; the sequence's end says why.
	_ = kvtransfer.SendState(ctx, kvtransfer.SenderConfig{Session: "x-whole", Secret: testSecret, Placement: wholeToStage{g},
		Deadline: time.Now().Add(20 * time.Second)}, ref.RemoteState(t, p))
	got, res, err := c.Wait(ctx, "whole")
	if err != nil || res.Reason != pipeline.ReasonError || len(got) != 0 {
		t.Fatalf("a whole state on tensor ranks: %v %+v %v", got, res, err)
	}
	// Which check refuses first depends on the arrival order: a part's
	// shape (naming the layer and both shapes) or the transfer's totals.
	msg := res.Err.Error()
	for _, s := range []string{"decode rank ", "'s slice of layers [0, 9) refused", "protocol violation"} {
		if !strings.Contains(msg, s) {
			t.Errorf("refusal %q does not say %q", msg, s)
		}
	}
	shape := strings.Contains(msg, "expected F32 [")
	if !strings.Contains(msg, "(the slice of tensor rank ") || !shape && !strings.Contains(msg, "this rank expects") {
		t.Errorf("refusal %q names neither the shapes nor the sizes", msg)
	}
	t.Logf("refused: %v", res.Err)
	g.checkFreed(t)
	if out, err := g.Generate(ctx, "after", p, 4); err != nil || !slices.Equal(out, ref.Greedy(t, p, 4)) {
		t.Fatalf("after the refusal: %v, %v", out, err)
	}
}
