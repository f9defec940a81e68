package service_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/metrics"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestRemoteSuffixThroughTheSystem: the turns of a session on the remote
// path, through NATS, the coordinator, the prefill worker with its prefix
// store and the decode group with its cache: each turn gives the
// monolithic model's greedy ids. The second turn's prefill worker resumes
// from its store (the timing says so, on the prefill worker) and the group
// appends the state to the rows it holds; with the store emptied the group
// still appends (a from-scratch prefill); with the group's cache emptied
// the store still serves (the whole state is sent).
func TestRemoteSuffixThroughTheSystem(t *testing.T) { remoteSuffixTurns(t, 1) }

// TestRemoteSuffixOnTensorRanks is the same session on a stage of two
// tensor ranks: each gets its slice of every transfer, an append's rows
// whole.
func TestRemoteSuffixOnTensorRanks(t *testing.T) { remoteSuffixTurns(t, 2) }

func remoteSuffixTurns(t *testing.T, tensor int) {
	opt := testOptions(t)
	opt.Metrics = metrics.New()
	opt.PrefixStore.Dir = t.TempDir()
	opt.Tensor = tensor
	c := startCluster(t, opt)
	ref := testmodel.LoadReference(t, opt.ModelDir, 1)
	nc := connect(t, c)
	vocab := c.Model.VocabSize
	const n = 6
	head := c.RankID(0)
	var p []int32
	var out []int32
	// entries waits until the coordinator has seen each side's entry
	// (from their heartbeats): the router prices the next turn by them.
	entries := func(store, group float64) {
		t.Helper()
		waitMetric(t, opt.Metrics, "prefill-0", "tandem_coordinator_prefix_cache_entries", store)
		waitMetric(t, opt.Metrics, head, "tandem_coordinator_prefix_cache_entries", group)
	}
	turn := func(i int, more []int32, wantStore, wantAppends int) {
		t.Helper()
		p = append(append(p, out...), more...)
		appends := c.Group.Head().Stats().Cache.AppendTokens
		res := run(t, nc, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: n}, Policy: cp.PolicyRemote})
		checkDone(t, res, ref.Greedy(t, p, n), cp.TargetRemote)
		out = res.Tokens
		tm := res.Final.Timing
		if wantStore > 0 && (tm.CachedTokens != wantStore || tm.CachedOn != "prefill-0") || wantStore == 0 && tm.CachedTokens != 0 {
			t.Fatalf("turn %d (%d tokens): %d cached on %q, want %d from the prefill worker's store", i, len(p), tm.CachedTokens, tm.CachedOn, wantStore)
		}
		if got := c.Group.Head().Stats().Cache.AppendTokens - appends; got != int64(wantAppends) {
			t.Fatalf("turn %d: the group appended to %d tokens of its rows, want %d", i, got, wantAppends)
		}
	}
	turn(1, testkit.Prompt(150, vocab, 1), 0, 0) // both keep 128
	entries(1, 1)
	held, _ := gauge(t, opt.Metrics, head, "tandem_coordinator_prefix_cache_bytes")
	turn(2, testkit.Prompt(120, vocab, 2), 128, 128) // 276 tokens: the worker prefills [128, 256)
	entries(1, 1)
	// The group's one entry now holds 256 tokens: more bytes, once its
	// heartbeat says so (the count alone was 1 before too, and the next
	// turn priced by the old entry appends to 128).
	waitGauge(t, opt.Metrics, head, "tandem_coordinator_prefix_cache_bytes", fmt.Sprintf("more than %v", held),
		func(v float64) bool { return v > held })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.PrefillWorker().StoreDrop(""); err != nil {
		t.Fatal(err)
	}
	entries(0, 1)
	turn(3, testkit.Prompt(100, vocab, 3), 0, 256) // 382: from scratch, appended to the group's 256
	entries(1, 1)
	for r := range c.Group.Layout.Ranks {
		if _, err := c.Group.Worker(r).DropCache(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	entries(1, 0)
	turn(4, testkit.Prompt(90, vocab, 4), 320, 0) // 478: the store's 320, the whole state sent
}
