package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
)

// TestCancelWithinALongPrefillLayer cancels a long local prompt while a
// rank is in the middle of an MLA layer of its one prefill step (the small
// preset, 1,024 rows at once, 2 ranks over real TCP), first on the head,
// then on rank 1, which hears of the cancel through the ring while it
// computes. Each time the rank runs at most two more calls of the layer,
// every rank frees the sequence within a second of the cancel (without
// cancellation inside the step, a rank frees it only after its whole share
// of the step: some 150 calls), the sequence ends as cancelled, a sequence
// decoding meanwhile and one submitted afterwards give the reference's
// greedy tokens, and nothing stays reserved.
//
// A call is one 64-row chunk of the prompt (about 1 GFLOP here, 50-100 ms
// of one idle core), the finest cut that keeps the chunked KDA exact; on a
// machine so loaded that a call takes over a third of a second, the bound
// is three calls' time instead of a second.
func TestCancelWithinALongPrefillLayer(t *testing.T) {
	if testing.Short() {
		t.Skip("prefills 1,024 tokens of the small preset twice")
	}
	dir := testmodel.Dir(t, "small", 1, 0)
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ref := testmodel.LoadReference(t, dir, 0)
	ctx := testctx.Context(t)
	g := startGroup(ctx, t, dir, 1024)
	c := group.NewCollector()
	for _, r := range []int{0, 1} {
		short := testkit.Prompt(100, cfg.VocabSize, 3+r)
		long := testkit.Prompt(1025, cfg.VocabSize, 5+r)
		next := testkit.Prompt(80, cfg.VocabSize, 8+r)
		wantShort, wantNext := ref.Greedy(t, short, 32), ref.Greedy(t, next, 6)
		cancelInLayer(ctx, t, g, c, cfg, r, fmt.Sprintf("r%d-", r), short, long, next, wantShort, wantNext)
	}
	if st := g.Head().Stats(); st.Failed != 0 {
		t.Fatalf("%d sequences failed (the group reset?)", st.Failed)
	}
}

func cancelInLayer(ctx context.Context, t *testing.T, g *group.Group, c *group.Collector, cfg *model.Config, onRank int, id string,
	short, long, next, wantShort, wantNext []int32) {
	spec := g.Layout.Ranks[onRank]
	mla := -1
	for L := spec.Lo; L < spec.Hi && mla < 0; L++ {
		if cfg.LayerKind(L) == model.MLA {
			mla = L
		}
	}
	if mla < 0 {
		t.Fatalf("rank %d holds no MLA layer in [%d, %d)", onRank, spec.Lo, spec.Hi)
	}
	head := g.Head()
	// A short prompt decodes while the long one prefills.
	if err := head.Submit(ctx, pipeline.Request{ID: id + "short", Tokens: short, MaxTokens: len(wantShort), Sink: c}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(ctx, t, "a token of the short prompt", func() bool { return len(c.Tokens(id+"short")) > 0 })

	var mu sync.Mutex
	var calls, after int // calls of the MLA layer over the long prompt; of them, after the cancel
	var cancelled, last time.Time
	var slowest time.Duration // the longest call of the layer
	cancelErr := make(chan error, 1)
	pipeline.SetOnCall(g.Worker(onRank), func(L, lo, hi int) {
		if L != mla || hi-lo < model.KDAChunk {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if calls > 0 {
			slowest = max(slowest, now.Sub(last))
		}
		last = now
		calls++
		if !cancelled.IsZero() {
			after++
		}
		if calls == 2 {
			cancelled = time.Now()
			go func() { cancelErr <- head.Cancel(ctx, id+"long") }() // from elsewhere, as a client's cancel comes
		}
	})
	defer pipeline.SetOnCall(g.Worker(onRank), nil)
	if err := head.Submit(ctx, pipeline.Request{ID: id + "long", Tokens: long, MaxTokens: 4, Sink: c}); err != nil {
		t.Fatal(err)
	}
	if err := <-cancelErr; err != nil {
		t.Fatalf("cancel: %v", err)
	}
	// Every rank frees it: each takes the Release once its step is over.
	for r := range g.Layout.Ranks {
		testkit.WaitFor(ctx, t, fmt.Sprintf("rank %d to free the long prompt", r), func() bool { return g.Worker(r).Stats().Sequences <= 1 || c.Done(id+"short") })
	}
	freed := time.Now()
	mu.Lock()
	took, n, later, call := freed.Sub(cancelled), calls, after, slowest
	mu.Unlock()
	if c.Done(id + "short") {
		t.Fatal("the short prompt ended before the long one was freed: the test cannot tell when that was")
	}
	got, res, err := c.Wait(ctx, id+"long")
	if err != nil || res.Reason != pipeline.ReasonCancelled || len(got) != 0 {
		t.Fatalf("long prompt: %d tokens, %v, %+v; want cancelled before its first token", len(got), err, res)
	}
	t.Logf("rank %d: layer %d in calls of one KDA chunk's rows (up to %v each); cancelled after call 2, %d more call(s); every rank freed it %v after the cancel",
		onRank, mla, call, later, took)
	if n < 2 {
		t.Fatalf("layer %d ran %d calls over the long prompt: not cut finely enough to cancel within it", mla, n)
	}
	if later > 2 {
		t.Errorf("rank %d ran %d calls of layer %d after the cancel, want at most 2", onRank, later, mla)
	}
	if bound := max(time.Second, 3*call); took > bound {
		t.Errorf("rank %d: the ranks freed the cancelled prompt %v after the cancel, want within %v", onRank, took, bound)
	}
	// The others go on: the short prompt, and one submitted now.
	got, res, err = c.Wait(ctx, id+"short")
	if err != nil || !slices.Equal(got, wantShort) {
		t.Fatalf("short prompt: %v %v %+v, want %v", got, err, res, wantShort)
	}
	if err := head.Submit(ctx, pipeline.Request{ID: id + "next", Tokens: next, MaxTokens: len(wantNext), Sink: c}); err != nil {
		t.Fatal(err)
	}
	if got, res, err := c.Wait(ctx, id+"next"); err != nil || !slices.Equal(got, wantNext) {
		t.Fatalf("a prompt after the cancel: %v %v %+v, want %v", got, err, res, wantNext)
	}
	for r := range g.Layout.Ranks {
		testkit.WaitFor(ctx, t, fmt.Sprintf("rank %d to hold nothing", r), func() bool { return g.Worker(r).Stats().Sequences == 0 })
	}
}

// startGroup starts a group of two ranks over TCP, one compute thread each,
// prefilling chunk rows per step; the test closes it.
func startGroup(ctx context.Context, t testing.TB, dir string, chunk int) *group.Group {
	t.Helper()
	opt := group.Options{ModelDir: dir, Ranks: 2, Threads: 1, PrefillChunk: chunk,
		Heartbeat: 200 * time.Millisecond, Idle: 5 * time.Second,
		Timeouts: kvtransfer.Timeouts{Handshake: 5 * time.Second, IO: 10 * time.Second, Idle: 10 * time.Second, KeepAlive: 200 * time.Millisecond}}
	return testkit.Start(t, func() (*group.Group, error) { return group.Start(ctx, opt) })
}
