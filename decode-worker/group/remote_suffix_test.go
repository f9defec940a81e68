package group

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/prefixstore"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// remoteTurn runs one job the way the coordinator does on the remote path
// with both caches: the prefill worker prefills the prompt up to its last
// multiple of 64 (R) from its store's longest prefix, the group takes the
// state (appending to the rows of base tokens it holds, when it takes the
// proposed base) and prefills the rest itself. It returns the greedy ids,
// the base the group took and the tokens the prefill worker took from its
// store.
func remoteTurn(t *testing.T, g *Group, pw *worker.Worker, id string, p []int32, propose, n int) ([]int32, int, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	R := (len(p) - 1) / prefixcache.Block * prefixcache.Block
	rm := g.remote("xfer-"+id, R)
	var appended int
	rm.Prompt, rm.Append, rm.Appended = p[:R], propose, &appended
	c := NewCollector()
	if err := g.Head().Submit(ctx, pipeline.Request{ID: id, Tokens: p[R:], MaxTokens: n, Remote: rm, Sink: c}); err != nil {
		t.Fatal(err)
	}
	place := kvtransfer.LayerMap{}
	for _, s := range g.Layout.Ranks {
		for L := s.Lo; L < s.Hi; L++ {
			place[L] = s.Endpoint
		}
	}
	sc := kvtransfer.SenderConfig{Session: "xfer-" + id, Secret: testSecret, Placement: place, Deadline: time.Now().Add(30 * time.Second)}
	if appended > 0 {
		// The prefill worker names the base by its own chain over its own
		// tokens: the ranks check it against the entry they hold.
		chain := prefixkey.Chain(prefixkey.SHA256, g.Head().Stats().CacheSalt, p[:appended])
		sc.Base, sc.BaseKey = appended, uint64(chain[len(chain)-1])
	}
	snd, err := kvtransfer.NewSender(sc)
	if err != nil {
		t.Fatal(err)
	}
	j, err := pw.Submit(worker.Spec{ID: id, Tokens: p[:R], Sink: sink.Suffix(snd, appended)})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	got, res, err := c.Wait(ctx, id)
	if err != nil || res.Err != nil {
		t.Fatalf("%s: %v %+v", id, err, res)
	}
	return got, appended, j.Result().Cached
}

// TestRemoteSuffix: the turns of a session on the remote path with the
// prefill worker's store and the group's cache: each turn's state is kept
// on both (at the prompt's last multiple of 64), the next turn's prefill
// worker resumes from its store and ships only the new MLA rows and the KDA
// states, which the ranks append to the rows they hold; every turn gives
// exactly the greedy ids of a from-scratch run of its whole prompt with no
// cache. A hit on one side with a miss on the other stays correct: the
// store lost its entry (the worker prefills from scratch, still sending
// only the new rows), or the group lost its (the worker resumes from its
// store and sends the whole state).
func TestRemoteSuffix(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	const n = 6
	p1 := testkit.Prompt(150, vocab, 1)
	out1 := ref.Greedy(t, p1, n)
	p2 := concat(p1, out1, testkit.Prompt(120, vocab, 2)) // 276 tokens: R = 256
	out2 := ref.Greedy(t, p2, n)
	p3 := concat(p2, out2, testkit.Prompt(100, vocab, 3)) // 382: R = 320
	out3 := ref.Greedy(t, p3, n)
	p4 := concat(p3, out3, testkit.Prompt(90, vocab, 4)) // 478: R = 448
	out4 := ref.Greedy(t, p4, n)

	opt := fastOpts(dir, 2)
	opt.PrefillChunk = 64
	g := startGroup(t, opt)
	salt := g.Head().Stats().CacheSalt
	mc, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	store, _, err := prefixstore.Open(prefixstore.Config{Dir: t.TempDir(), MaxBytes: 1 << 30, Model: mc, DType: model.BF16, Salt: salt})
	if err != nil {
		t.Fatal(err)
	}
	pw, err := worker.New(worker.Config{Model: dir, Budget: 256 << 20, Depth: -1, Threads: 2, Log: zaptest.NewLogger(t), ReadSize: 64 << 10, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pw.Close() })

	turn := func(i int, p, want []int32, propose, wantAppend, wantCached int) {
		t.Helper()
		got, appended, cached := remoteTurn(t, g, pw, name("turn%d", i), p, propose, n)
		if !slices.Equal(got, want) {
			t.Fatalf("turn %d (%d tokens, appended to %d, %d from the store): %v\nfrom scratch: %v", i, len(p), appended, cached, got, want)
		}
		if appended != wantAppend || cached != wantCached {
			t.Fatalf("turn %d: the group appended to %d tokens (want %d), the store gave %d (want %d)", i, appended, wantAppend, cached, wantCached)
		}
		R := (len(p) - 1) / 64 * 64
		g.waitCache(t, 1, "the turn's entry", func(s prefixcache.Stats) bool { return s.Inserts == int64(i) })
		if l := g.sameEntries(t); len(l) != 1 || l[0].Tokens != R {
			t.Fatalf("after turn %d the group holds %+v, want one entry of %d tokens", i, l, R)
		}
		if l := store.List(); len(l) != 1 || l[0].Tokens != R {
			t.Fatalf("after turn %d the store holds %+v, want one entry of %d tokens", i, l, R)
		}
	}
	// Turn 1: nothing cached anywhere.
	turn(1, p1, out1, 0, 0, 0)
	// Turn 2: both hold 128: 128 tokens prefilled, rows [128, 256) sent.
	turn(2, p2, out2, 128, 128, 128)
	// Turn 3: the store lost its entry: a from-scratch prefill, still an
	// append to the group's 256.
	if store.Drop("") != 1 {
		t.Fatal("nothing to drop from the store")
	}
	turn(3, p3, out3, 256, 256, 0)
	// Turn 4: the group lost its entry: the store's 320 resumed, the
	// whole state sent (the proposed base is not taken).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for r := range g.Layout.Ranks {
		if _, err := g.Worker(r).DropCache(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	turn(4, p4, out4, 320, 0, 320)
	g.checkFreed(t)
}
