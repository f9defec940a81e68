package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/frontdoor"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/health/healthtest"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestProcessGroups: groups of 1, 2 and 3 decode-worker processes on
// loopback generate the monolithic model's greedy ids for 32 steps, on the
// tiny and small models, for a locally prefilled sequence and, batched with
// it, a remote-prefilled one whose state is moved by kvtransfer.
func TestProcessGroups(t *testing.T) {
	for _, tc := range []struct {
		preset string
		shards int
	}{{"tiny", 2}, {"small", 0}} {
		t.Run(tc.preset, func(t *testing.T) {
			if tc.preset == "small" && (testing.Short() || raceEnabled) {
				t.Skip("small model: skipped in -short mode and under the race detector")
			}
			dir := testmodel.Dir(t, tc.preset, 1, tc.shards)
			ref := testmodel.LoadReference(t, dir, 0)
			vocab := ref.Cfg.VocabSize
			local, remote := testkit.Prompt(5, vocab, 1), testkit.Prompt(7, vocab, 2)
			const n = 32
			wantLocal, wantRemote := ref.Greedy(t, local, n), ref.Greedy(t, remote, n)
			state := ref.RemoteState(t, remote)
			for ranks := 1; ranks <= 3; ranks++ {
				t.Run(fmt.Sprintf("ranks%d", ranks), func(t *testing.T) {
					c := startCluster(t, dir, ranks, nil)
					ctx := testctx.Context(t)
					head := c.client(ctx, 0)
					waitFormed(ctx, t, head)
					ls, err := head.Submit(ctx, frontdoor.Request{ID: "local", Tokens: local, MaxTokens: n})
					if err != nil {
						t.Fatal(err)
					}
					rs, err := head.Submit(ctx, frontdoor.Request{ID: "remote", Tokens: remote[len(remote)-1:], MaxTokens: n,
						Remote: c.remote("xfer-remote", len(remote)-1)})
					if err != nil {
						t.Fatal(err)
					}
					if err := c.send(ctx, state.Clone(), "xfer-remote"); err != nil {
						t.Fatal(err)
					}
					for _, x := range []struct {
						s    *frontdoor.Stream
						want []int32
						name string
					}{{ls, wantLocal, "local"}, {rs, wantRemote, "remote"}} {
						got, res, err := x.s.Wait(ctx)
						if err != nil || res.Reason != pipeline.ReasonLength {
							t.Fatalf("%s: %v %+v", x.name, err, res)
						}
						if !slices.Equal(got, x.want) {
							t.Fatalf("%s, %d ranks: %v\nmonolithic: %v", x.name, ranks, got, x.want)
						}
					}
					for r := range c.layout.Ranks {
						cl := head
						if r > 0 {
							cl = c.client(ctx, r)
						}
						waitIdle(ctx, t, cl, r)
					}
				})
			}
		})
	}
}

// waitIdle waits until rank r holds no sequence and no reserved memory.
func waitIdle(ctx context.Context, t *testing.T, cl *frontdoor.Client, r int) frontdoor.Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := cl.Stats(ctx)
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if st.Sequences == 0 && st.ReservedBytes == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank %d still holds %d sequences, %d bytes", r, st.Sequences, st.ReservedBytes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestProcessKill: SIGKILL of the middle rank of three mid-decode ends every
// sequence with an error naming the lost link within seconds; the other
// ranks free the state, refuse new work while the rank is gone, leak no
// goroutines, and serve again once it is restarted.
func TestProcessKill(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := testkit.Prompt(6, ref.Cfg.VocabSize, 3)
	c := startCluster(t, dir, 3, nil)
	ctx := testctx.Context(t)
	head := c.client(ctx, 0)
	waitFormed(ctx, t, head)
	last := c.client(ctx, 2)
	base := []int{waitIdle(ctx, t, head, 0).Goroutines, waitIdle(ctx, t, last, 2).Goroutines}

	var streams []*frontdoor.Stream
	for i := 0; i < 3; i++ {
		s, err := head.Submit(ctx, frontdoor.Request{ID: fmt.Sprintf("s%d", i), Tokens: p, MaxTokens: 100000})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	for _, s := range streams {
		if _, err := s.WaitTokens(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	c.kill(1)
	for i, s := range streams {
		got, res, err := s.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Reason != pipeline.ReasonError || !strings.Contains(res.Err, "lost its link to rank") {
			t.Fatalf("s%d: %+v", i, res)
		}
		if !slices.Equal(got[:5], ref.Greedy(t, p, 5)) {
			t.Fatalf("s%d: the tokens before the kill were wrong: %v", i, got)
		}
	}
	if d := time.Since(killed); d > 5*time.Second {
		t.Fatalf("sequences ended %v after the kill", d)
	}
	_, res0, _ := streams[0].Wait(ctx)
	t.Logf("every sequence ended within %v: %s", time.Since(killed).Round(time.Millisecond), res0.Err)
	waitIdle(ctx, t, head, 0)
	waitIdle(ctx, t, last, 2)

	_, err := head.Submit(ctx, frontdoor.Request{ID: "while-down", Tokens: p, MaxTokens: 2})
	if err == nil || !strings.Contains(err.Error(), pipeline.ErrNotReady.Error()) {
		t.Fatalf("submission while rank 1 is down: %v", err)
	}

	c.start(1)
	waitFormed(ctx, t, head)
	s, err := head.Submit(ctx, frontdoor.Request{ID: "after", Tokens: p, MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	got, res, err := s.Wait(ctx)
	if err != nil || res.Reason != pipeline.ReasonLength || !slices.Equal(got, ref.Greedy(t, p, 8)) {
		t.Fatalf("after the restart: %v %+v %v", got, res, err)
	}
	// The surviving ranks are back to their goroutine count before the
	// failure: nothing of the failed sequences or the old links is left.
	for i, cl := range []*frontdoor.Client{head, last} {
		r := []int{0, 2}[i]
		deadline := time.Now().Add(5 * time.Second)
		for {
			st := waitIdle(ctx, t, cl, r)
			if st.Goroutines <= base[i] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d runs %d goroutines, %d before the failure", r, st.Goroutines, base[i])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestProcessRefusals: a sequence that does not fit a rank's memory budget
// is refused by that rank at admission; a remote state that fails
// verification ends its sequence before any token; the group keeps serving.
func TestProcessRefusals(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	p := testkit.Prompt(10, ref.Cfg.VocabSize, 4)
	c := startCluster(t, dir, 2, func(r int) string {
		if r == 1 {
			return "    memory_budget: 256KiB\n"
		}
		return ""
	})
	ctx := testctx.Context(t)
	head := c.client(ctx, 0)
	waitFormed(ctx, t, head)

	_, err := head.Submit(ctx, frontdoor.Request{ID: "big", Tokens: p, MaxTokens: 20000})
	var re *frontdoor.RefusedError
	if !errors.As(err, &re) || re.Rank != 1 || !strings.Contains(re.Reason, "does not fit") {
		t.Fatalf("oversized: %v", err)
	}
	t.Logf("refused: %v", err)

	s, err := head.Submit(ctx, frontdoor.Request{ID: "bad-state", Tokens: p[9:], MaxTokens: 4, Remote: c.remote("x-bad", 9)})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.send(ctx, ref.RemoteState(t, p[:6]), "x-bad") // 5 tokens where 9 are expected
	got, res, err := s.Wait(ctx)
	if err != nil || res.Reason != pipeline.ReasonError || len(got) != 0 || !strings.Contains(res.Err, "refused") {
		t.Fatalf("bad state: %v %+v %v", got, res, err)
	}
	t.Logf("bad state: %s", res.Err)
	waitIdle(ctx, t, head, 0)
	waitIdle(ctx, t, c.client(ctx, 1), 1)

	s, err = head.Submit(ctx, frontdoor.Request{ID: "fits", Tokens: p, MaxTokens: 6})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Wait(ctx); err != nil || !slices.Equal(got, ref.Greedy(t, p, 6)) {
		t.Fatalf("after the refusals: %v %v", got, err)
	}
}

// TestProcessMetrics runs a 2-rank group of processes with their
// operations endpoint on, runs a local and a remote job through the head,
// and scrapes every rank: /readyz is ready once the ring is formed, and
// /metrics (the exposition parsed) counts the sequences, tokens and steps,
// the state received over kvtransfer on every rank, and exports every
// decode metric the Grafana dashboard queries.
func TestProcessMetrics(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	vocab := ref.Cfg.VocabSize
	local, remote := testkit.Prompt(5, vocab, 3), testkit.Prompt(70, vocab, 4)
	const n = 8
	state := ref.RemoteState(t, remote)
	c := startCluster(t, dir, 2, nil, "--log-format", "json", "--metrics-listen", "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bases := make([]string, 2)
	for r := range bases {
		bases[r] = c.metricsURL(ctx, t, r)
	}
	head := c.client(ctx, 0)
	waitFormed(ctx, t, head)
	for r, base := range bases {
		if code, body, err := healthtest.Get(base + "/healthz"); err != nil || code != http.StatusOK {
			t.Fatalf("rank %d /healthz: %d %q %v", r, code, body, err)
		}
		// The head has seen the ring formed; each rank sees it too, at
		// the latest one mesh heartbeat later.
		for {
			code, body, err := healthtest.Get(base + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			if code == http.StatusOK && body == "ready\n" {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("rank %d /readyz: %d %q", r, code, body)
			case <-time.After(20 * time.Millisecond): // polling the endpoint
			}
		}
	}
	ls, err := head.Submit(ctx, frontdoor.Request{ID: "local", Tokens: local, MaxTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := head.Submit(ctx, frontdoor.Request{ID: "remote", Tokens: remote[len(remote)-1:], MaxTokens: n,
		Remote: c.remote("xfer-metrics", len(remote)-1)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.send(ctx, state.Clone(), "xfer-metrics"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*frontdoor.Stream{ls, rs} {
		if _, res, err := s.Wait(ctx); err != nil || res.Reason != pipeline.ReasonLength {
			t.Fatalf("%v %+v", err, res)
		}
	}
	for r := range bases {
		cl := head
		if r > 0 {
			cl = c.client(ctx, r)
		}
		waitIdle(ctx, t, cl, r)
	}
	all := healthtest.Families{}
	for r, base := range bases {
		f, err := healthtest.Scrape(base)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range f {
			all[k] = v
		}
		for _, x := range []struct {
			name string
			ok   bool
		}{
			{"tandem_decode_ring_formed", f.Value("tandem_decode_ring_formed") == 1},
			{"tandem_decode_steps_total", f.Value("tandem_decode_steps_total") > 0},
			{"tandem_decode_compute_seconds_total", f.Value("tandem_decode_compute_seconds_total") > 0},
			{"tandem_decode_transfer_received_bytes_total", f.Value("tandem_decode_transfer_received_bytes_total") > 0},
			{"tandem_decode_transfer_sessions_total committed", f.Value("tandem_decode_transfer_sessions_total", "outcome", "committed") == 1},
			{"tandem_decode_state_reserved_bytes (idle)", f.Exports("tandem_decode_state_reserved_bytes") && f.Value("tandem_decode_state_reserved_bytes") == 0},
			{"tandem_decode_sequences (idle)", f.Exports("tandem_decode_sequences") && f.Value("tandem_decode_sequences") == 0},
		} {
			if !x.ok {
				t.Errorf("rank %d: %s is not as the jobs say", r, x.name)
			}
		}
		if r == 0 {
			for _, x := range []struct {
				name   string
				labels []string
				want   float64
			}{
				{"tandem_decode_sequences_total", []string{"outcome", "admitted"}, 2},
				{"tandem_decode_sequences_total", []string{"outcome", "finished"}, 2},
				{"tandem_decode_sequences_total", []string{"outcome", "failed"}, 0},
				{"tandem_decode_tokens_total", nil, 2 * n},
			} {
				if got := f.Value(x.name, x.labels...); got != x.want {
					t.Errorf("rank 0: %s%v = %v, want %v", x.name, x.labels, got, x.want)
				}
			}
			if f.Value("tandem_decode_decode_steps_total") <= 0 {
				t.Error("rank 0: no decode step counted")
			}
			drafted, accepted, rejected := f.Value("tandem_decode_draft_drafted_tokens_total"), f.Value("tandem_decode_draft_accepted_tokens_total"), f.Value("tandem_decode_draft_rejected_tokens_total")
			if !f.Exports("tandem_decode_draft_drafted_tokens_total") || !f.Exports("tandem_decode_draft_accepted_length") || accepted+rejected != drafted {
				t.Errorf("rank 0: speculative decoding's series: drafted %v, accepted %v, rejected %v", drafted, accepted, rejected)
			}
		}
	}
	missing, err := all.DashboardsMissing("tandem_decode_", "go_", "process_")
	if err != nil || len(missing) > 0 {
		t.Errorf("dashboard metrics the decode ranks do not export: %v %v", missing, err)
	}
}

// metricsURL waits for rank r to log where it serves /metrics and returns
// the endpoint's base URL.
func (c *cluster) metricsURL(ctx context.Context, t *testing.T, r int) string {
	t.Helper()
	for {
		for _, line := range strings.Split(c.procs[r].out.String(), "\n") {
			var l struct{ Msg, URL string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "metrics and health" {
				return strings.TrimSuffix(l.URL, "/metrics")
			}
		}
		select {
		case <-c.procs[r].done:
			t.Fatalf("rank %d exited", r)
		case <-ctx.Done():
			t.Fatalf("rank %d logged no metrics address", r)
		case <-time.After(20 * time.Millisecond): // polling its log for the line
		}
	}
}
