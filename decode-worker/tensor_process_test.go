package main

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/frontdoor"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestProcessTensorGroup: four decode-worker processes as two pipeline
// stages of two tensor ranks (tensor: 2 in the group file) generate the
// monolithic model's greedy ids, every rank summing its stage's parts with
// its peer. SIGKILL of one tensor rank mid-decode ends every sequence with
// an error naming the lost link within seconds, no rank hangs in a
// reduction, and once the rank is back the stage connects again and the
// group serves the same ids. A tensor rank that stalls instead holds its
// peer for at most the step timeout.
func TestProcessTensorGroup(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := testkit.Prompt(9, ref.Cfg.VocabSize, 4)
	const n = 24
	want := ref.Greedy(t, p, n)
	c := startTensorCluster(t, dir, 4, 2, nil, "--step-timeout", "2s")
	ctx := testctx.Context(t)
	head := c.client(ctx, 0)
	waitFormed(ctx, t, head)
	generate := func(id string) []int32 {
		t.Helper()
		s, err := head.Submit(ctx, frontdoor.Request{ID: id, Tokens: p, MaxTokens: n})
		if err != nil {
			t.Fatal(err)
		}
		got, res, err := s.Wait(ctx)
		if err != nil || res.Reason != pipeline.ReasonLength {
			t.Fatalf("%s: %v %+v", id, err, res)
		}
		return got
	}
	if got := generate("first"); !slices.Equal(got, want) {
		t.Fatalf("2 x 2 processes: %v\nmonolithic: %v", got, want)
	}
	for r := range c.layout.Ranks {
		cl := head
		if r > 0 {
			cl = c.client(ctx, r)
		}
		if st := waitIdle(ctx, t, cl, r); st.Reductions == 0 {
			t.Fatalf("rank %d ran no reduction: the stage was not split", r)
		}
	}

	var streams []*frontdoor.Stream
	for i := range 2 {
		s, err := head.Submit(ctx, frontdoor.Request{ID: fmt.Sprintf("long%d", i), Tokens: p, MaxTokens: 100000})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	for _, s := range streams {
		if _, err := s.WaitTokens(ctx, 3); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	c.kill(2) // stage 1's first tensor rank: a ring link and its stage peer's reductions go
	for i, s := range streams {
		_, res, err := s.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Reason != pipeline.ReasonError || !strings.Contains(res.Err, "rank 2") {
			t.Fatalf("long%d: %+v", i, res)
		}
	}
	if d := time.Since(killed); d > 5*time.Second {
		t.Fatalf("sequences ended %v after the kill", d)
	}
	_, res, _ := streams[0].Wait(ctx)
	t.Logf("every sequence ended within %v: %s", time.Since(killed).Round(time.Millisecond), res.Err)
	for _, r := range []int{0, 1, 3} {
		cl := head
		if r > 0 {
			cl = c.client(ctx, r)
		}
		waitIdle(ctx, t, cl, r)
	}

	c.start(2)
	waitFormed(ctx, t, head)
	if got := generate("after"); !slices.Equal(got, want) {
		t.Fatalf("after the restart: %v\nmonolithic: %v", got, want)
	}

	// A stage peer that stalls (SIGSTOP: its links stay open) holds its
	// partner's reduction for at most the step timeout: the partner's
	// loop fails the step and leaves the ring; once the peer resumes,
	// the group serves again.
	s, err := head.Submit(ctx, frontdoor.Request{ID: "stalled", Tokens: p, MaxTokens: 100000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitTokens(ctx, 3); err != nil {
		t.Fatal(err)
	}
	stopped := c.procs[3].cmd.Process
	if err := stopped.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopped.Signal(syscall.SIGCONT) })
	if _, res, err := s.Wait(ctx); err != nil || res.Reason != pipeline.ReasonError {
		t.Fatalf("with rank 3 stopped: %v %+v", err, res)
	}
	partner := c.client(ctx, 2)
	for st, err := partner.Stats(ctx); err != nil || st.Formed; st, err = partner.Stats(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("rank 2 is still in its ring with its stage peer stopped: its reduction waits forever")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := stopped.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFormed(ctx, t, head)
	if got := generate("resumed"); !slices.Equal(got, want) {
		t.Fatalf("after the stall: %v\nmonolithic: %v", got, want)
	}
}
