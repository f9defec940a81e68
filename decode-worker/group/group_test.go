package group

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGenerateMatchesMonolithic: a group of 1, 2 and 3 ranks generates the
// monolithic model's greedy ids, for a prompt prefilled by the group itself.
func TestGenerateMatchesMonolithic(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := []int32{5, 17, 200, 33, 4, 250}
	want := ref.Greedy(t, p, 32)
	for ranks := 1; ranks <= 3; ranks++ {
		t.Run(fmt.Sprintf("ranks%d", ranks), func(t *testing.T) {
			g := startGroup(t, fastOpts(dir, ranks))
			ctx := testctx.Context(t)
			got, err := g.Generate(ctx, "s1", p, 32)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("group of %d: %v\nmonolithic:  %v", ranks, got, want)
			}
			g.checkFreed(t)
		})
	}
}

// TestBatchedSequences: 8 sequences of different prompt lengths (some
// longer than a prefill chunk, so chunked and batched prefill is exercised)
// submitted together decode in shared steps, several in flight, and each
// gives exactly its monolithic ids; remote and local sequences mix.
func TestBatchedSequences(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	lens := []int{1, 2, 9, 64, 65, 150, 3, 200}
	const n = 24
	want := make([][]int32, len(lens))
	prompts := make([][]int32, len(lens))
	for i, l := range lens {
		prompts[i] = testkit.Prompt(l, vocab, i)
		want[i] = ref.Greedy(t, prompts[i], n)
	}
	for ranks := 1; ranks <= 3; ranks++ {
		t.Run(fmt.Sprintf("ranks%d", ranks), func(t *testing.T) {
			opt := fastOpts(dir, ranks)
			opt.PrefillChunk = 64
			g := startGroup(t, opt)
			ctx := testctx.Context(t)
			c := NewCollector()
			// Submitted concurrently, as a control plane with many jobs does.
			errs := make(chan error, len(prompts))
			for i, p := range prompts {
				go func() {
					req := pipeline.Request{ID: name("s%d", i), Tokens: p, MaxTokens: n, Sink: c}
					if i%3 == 2 { // every third prefilled "remotely"
						req.Tokens = p[len(p)-1:]
						req.Remote = g.remote(name("xfer-%d", i), len(p)-1)
					}
					err := g.Head().Submit(ctx, req)
					if err == nil && req.Remote != nil {
						err = g.send(ctx, ref.RemoteState(t, p), name("xfer-%d", i))
					}
					errs <- err
				}()
			}
			for range prompts {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for i := range prompts {
				got, res, err := c.Wait(ctx, name("s%d", i))
				if err != nil || res.Reason != pipeline.ReasonLength {
					t.Fatalf("s%d: %v, %+v", i, err, res)
				}
				if !slices.Equal(got, want[i]) {
					t.Fatalf("s%d (prompt of %d): %v\nmonolithic: %v", i, lens[i], got, want[i])
				}
			}
			// With MicroBatches = ranks slots, the 8 sequences share at most
			// that many steps per token once they all decode.
			st := g.Head().Stats()
			if want := (len(prompts) + ranks - 1) / ranks; st.LargestDecodeStep < want {
				t.Errorf("largest decode step has %d sequences, want %d or more", st.LargestDecodeStep, want)
			}
			t.Logf("%d decode steps, %.2f sequences each, at most %d", st.DecodeSteps, float64(st.DecodeRows)/float64(st.DecodeSteps), st.LargestDecodeStep)
			g.checkFreed(t)
		})
	}
}

// TestSeededSampling: temperature, top-k and top-p with a seed give the
// monolithic model's tokens drawn by the same sampler, whatever the batch.
func TestSeededSampling(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	params := []sampling.Params{
		{Temperature: 0.8, Seed: 1},
		{Temperature: 1.2, TopK: 20, Seed: 2},
		{Temperature: 0.7, TopP: 0.9, Seed: 3},
		{Temperature: 1, TopK: 50, TopP: 0.8, Seed: 4},
	}
	p := testkit.Prompt(7, ref.Cfg.VocabSize, 3)
	g := startGroup(t, fastOpts(dir, 3))
	ctx := testctx.Context(t)
	c := NewCollector()
	for i, sp := range params {
		if err := g.Head().Submit(ctx, pipeline.Request{ID: name("s%d", i), Tokens: p, MaxTokens: 20, Sampling: sp, Sink: c}); err != nil {
			t.Fatal(err)
		}
	}
	for i, sp := range params {
		got, _, err := c.Wait(ctx, name("s%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if want := sampled(t, ref, p, 20, sp); !slices.Equal(got, want) {
			t.Fatalf("%+v: %v\nmonolithic: %v", sp, got, want)
		}
	}
}

// TestStopAndCancel: a stop token ends a sequence with it; Cancel ends one
// mid-decode; every rank frees both.
func TestStopAndCancel(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := testkit.Prompt(5, ref.Cfg.VocabSize, 9)
	want := ref.Greedy(t, p, 12)
	stop := want[6]
	cut := slices.Index(want, stop) + 1
	g := startGroup(t, fastOpts(dir, 3))
	ctx := testctx.Context(t)
	c := NewCollector()
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "stop", Tokens: p, MaxTokens: 12, Stop: []int32{stop}, Sink: c}); err != nil {
		t.Fatal(err)
	}
	got, res, err := c.Wait(ctx, "stop")
	if err != nil || res.Reason != pipeline.ReasonStop || !slices.Equal(got, want[:cut]) {
		t.Fatalf("stop token %d: %v %v %+v, want %v", stop, got, err, res, want[:cut])
	}
	if err := g.Head().Submit(ctx, pipeline.Request{ID: "long", Tokens: p, MaxTokens: 100000, Sink: c}); err != nil {
		t.Fatal(err)
	}
	waitTokens(t, c, "long", 5)
	if err := g.Head().Cancel(ctx, "long"); err != nil {
		t.Fatal(err)
	}
	got, res, err = c.Wait(ctx, "long")
	if err != nil || res.Reason != pipeline.ReasonCancelled || len(got) < 5 || !slices.Equal(got[:5], ref.Greedy(t, p, 5)) {
		t.Fatalf("cancelled: %d tokens, %v, %+v", len(got), err, res)
	}
	if err := g.Head().Cancel(ctx, "long"); err == nil {
		t.Error("cancelling an ended sequence succeeded")
	}
	g.checkFreed(t)
}

// TestRefusals: a sequence whose state does not fit a rank's budget, or
// whose remote state fails verification, is refused before any token, with
// a reason naming the rank; nothing stays reserved.
func TestRefusals(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	opt := fastOpts(dir, 3)
	opt.MemoryBudget = 1 << 20
	g := startGroup(t, opt)
	head := g.Head()
	ctx := testctx.Context(t)
	c := NewCollector()
	p := testkit.Prompt(10, ref.Cfg.VocabSize, 1)

	// Too long for 1 MiB on a rank that holds MLA layers.
	err := head.Submit(ctx, pipeline.Request{ID: "big", Tokens: p, MaxTokens: 50000, Sink: c})
	var re *pipeline.RefusedError
	if !errors.As(err, &re) || !errors.Is(err, pipeline.ErrRefused) || !strings.Contains(re.Reason, "does not fit") {
		t.Fatalf("oversized sequence: %v", err)
	}
	t.Logf("refused: %v", err)
	g.checkFreed(t)

	// A state with the wrong number of tokens: kvtransfer refuses its shapes.
	if err := head.Submit(ctx, pipeline.Request{ID: "short", Tokens: p[9:], MaxTokens: 4, Remote: g.remote("x-short", 9), Sink: c}); err != nil {
		t.Fatal(err)
	}
	_ = g.send(ctx, ref.RemoteState(t, p[:9]), "x-short") // 8 tokens, not 9
	got, res, err := c.Wait(ctx, "short")
	if err != nil || res.Reason != pipeline.ReasonError || len(got) != 0 || !strings.Contains(res.Err.Error(), "refused") {
		t.Fatalf("wrong-length state: %v %+v %v", got, res, err)
	}
	t.Logf("wrong-length state: %v", res.Err)

	// A state with a NaN in a KDA state passes the wire checks but not Verify.
	st := ref.RemoteState(t, p)
	for _, ls := range st.Layers {
		if kp := ls.Part(2); kp != nil { // model.PartKDAState
			kp.F32()[17] = float32(nanF())
			break
		}
	}
	if err := head.Submit(ctx, pipeline.Request{ID: "nan", Tokens: p[9:], MaxTokens: 4, Remote: g.remote("x-nan", 9), Sink: c}); err != nil {
		t.Fatal(err)
	}
	// The transfer to the other ranks may be cancelled once one rank refused.
	_ = g.send(ctx, st, "x-nan")
	got, res, err = c.Wait(ctx, "nan")
	if err != nil || res.Reason != pipeline.ReasonError || len(got) != 0 || !strings.Contains(res.Err.Error(), "NaN") {
		t.Fatalf("NaN state: %v %+v %v", got, res, err)
	}
	t.Logf("NaN state: %v", res.Err)
	g.checkFreed(t)

	// The group still serves.
	if _, err := g.Generate(ctx, "after", p, 4); err != nil {
		t.Fatal(err)
	}
	// Bad requests are refused before admission.
	for _, req := range []pipeline.Request{
		{ID: "", Tokens: p, MaxTokens: 1, Sink: c},
		{ID: "x", MaxTokens: 1, Sink: c},
		{ID: "x", Tokens: p, MaxTokens: 0, Sink: c},
		{ID: "x", Tokens: []int32{-1}, MaxTokens: 1, Sink: c},
		{ID: "x", Tokens: []int32{int32(ref.Cfg.VocabSize)}, MaxTokens: 1, Sink: c},
		{ID: "x", Tokens: p, MaxTokens: 1},
		{ID: "x", Tokens: p, MaxTokens: 1, Sampling: sampling.Params{TopP: 2}, Sink: c},
		{ID: "x", Tokens: p, MaxTokens: 1, Remote: &pipeline.Remote{Tokens: 3}, Sink: c},
	} {
		if err := head.Submit(ctx, req); err == nil {
			t.Errorf("request %+v accepted", req)
		}
	}
	if err := g.Worker(1).Submit(ctx, pipeline.Request{ID: "x", Tokens: p, MaxTokens: 1, Sink: c}); err == nil {
		t.Error("rank 1 took a submission")
	}
	g.checkFreed(t)
}

// TestRankFailure: stopping a rank mid-decode ends every sequence with an
// error naming the lost link within seconds; the other ranks free their
// state, refuse new sequences until the rank is back, then serve again.
func TestRankFailure(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := testkit.Prompt(6, ref.Cfg.VocabSize, 2)
	g := startGroup(t, fastOpts(dir, 3))
	ctx := testctx.Context(t)
	c := NewCollector()
	for i := 0; i < 3; i++ {
		if err := g.Head().Submit(ctx, pipeline.Request{ID: name("s%d", i), Tokens: p, MaxTokens: 100000, Sink: c}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		waitTokens(t, c, name("s%d", i), 3)
	}
	stopped := time.Now()
	g.Stop(1)
	for i := 0; i < 3; i++ {
		_, res, err := c.Wait(ctx, name("s%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if res.Reason != pipeline.ReasonError || !strings.Contains(res.Err.Error(), "lost its link") {
			t.Fatalf("s%d: %+v", i, res)
		}
		if d := time.Since(stopped); d > 5*time.Second {
			t.Fatalf("s%d ended %v after the rank stopped", i, d)
		}
	}
	t.Logf("ended within %v: %v", time.Since(stopped), c.seqs["s0"].res.Err)
	for _, r := range []int{0, 2} {
		deadline := time.Now().Add(5 * time.Second)
		for st := g.Worker(r).Stats(); st.Sequences != 0 || st.ReservedBytes != 0; st = g.Worker(r).Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("rank %d still holds %d sequences", r, st.Sequences)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	err := g.Head().Submit(ctx, pipeline.Request{ID: "while-down", Tokens: p, MaxTokens: 2, Sink: c})
	if !errors.Is(err, pipeline.ErrNotReady) {
		t.Fatalf("submission while a rank is down: %v", err)
	}
	if err := g.Restart(1); err != nil {
		t.Fatal(err)
	}
	if err := g.Head().WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := g.Generate(ctx, "after", p, 8)
	if err != nil {
		t.Fatal(err)
	}
	if want := ref.Greedy(t, p, 8); !slices.Equal(got, want) {
		t.Fatalf("after the restart: %v, want %v", got, want)
	}
	g.checkFreed(t)
}

// TestFullSlots: with one micro-batch of one sequence, later sequences wait
// for room and still decode exactly, one per step.
func TestFullSlots(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	opt := fastOpts(dir, 2)
	opt.MicroBatches, opt.MaxBatch = 1, 1
	g := startGroup(t, opt)
	ctx := testctx.Context(t)
	c := NewCollector()
	for i := 0; i < 3; i++ {
		if err := g.Head().Submit(ctx, pipeline.Request{ID: name("s%d", i), Tokens: testkit.Prompt(4, ref.Cfg.VocabSize, i), MaxTokens: 6, Sink: c}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		got, _, err := c.Wait(ctx, name("s%d", i))
		if err != nil || !slices.Equal(got, ref.Greedy(t, testkit.Prompt(4, ref.Cfg.VocabSize, i), 6)) {
			t.Fatalf("s%d: %v %v", i, got, err)
		}
	}
	if st := g.Head().Stats(); st.LargestDecodeStep != 1 || st.DecodeSteps != 18 {
		t.Fatalf("%d decode steps, largest %d; want 18 of one sequence", st.DecodeSteps, st.LargestDecodeStep)
	}
	g.checkFreed(t)
}
