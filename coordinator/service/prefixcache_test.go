package service_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/metrics"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestSessionTurnsFromThePrefixCache: through the whole system, the second
// turn of a session (the first turn's prompt, its reply and new tokens)
// resumes from the decode group's prefix cache: the same tokens as the
// monolithic model, and its final timing (and the CLI's report of it) says
// how many prompt tokens came from the cache and on which worker.
func TestSessionTurnsFromThePrefixCache(t *testing.T) {
	opt := testOptions(t)
	opt.Metrics = metrics.New()
	c := startCluster(t, opt)
	ref := testmodel.LoadReference(t, opt.ModelDir, 1)
	nc := connect(t, c)
	vocab := c.Model.VocabSize
	first := testkit.Prompt(150, vocab, 5)
	res := run(t, nc, cp.SubmitRequest{TokenIDs: first, Sampling: cp.Sampling{MaxTokens: 8}, Policy: cp.PolicyLocal})
	checkDone(t, res, ref.Greedy(t, first, 8), cp.TargetLocal)
	if tm := res.Final.Timing; tm.CachedTokens != 0 || tm.CachedOn != "" {
		t.Fatalf("first turn: %+v", tm)
	}
	second := append(append(append([]int32(nil), first...), res.Tokens...), testkit.Prompt(30, vocab, 6)...)
	// The head's heartbeat advertises the first turn's prefix: the router
	// prices the second turn's local prefill without it.
	waitMetric(t, opt.Metrics, c.RankID(0), "tandem_coordinator_prefix_cache_entries", 1)
	res = run(t, nc, cp.SubmitRequest{TokenIDs: second, Sampling: cp.Sampling{MaxTokens: 8}, Policy: cp.PolicyLocal})
	checkDone(t, res, ref.Greedy(t, second, 8), cp.TargetLocal)
	if rt := res.Final.Route; rt.CachedTokens != 128 || !strings.Contains(client.Route(rt), "holds the first 128 tokens") {
		t.Fatalf("route %+v: the router did not price the cached prefix", rt)
	}
	tm := res.Final.Timing
	if tm.CachedTokens != 128 || tm.CachedOn != res.Final.Route.DecodeGroup+"-r0" {
		t.Fatalf("second turn: %d cached tokens on %q, want 128 on the group's head (route %+v)", tm.CachedTokens, tm.CachedOn, res.Final.Route)
	}
	if s := client.Timing(tm, cp.TargetLocal); !strings.Contains(s, "128 of them from its prefix cache on "+tm.CachedOn) {
		t.Fatalf("the timing report does not say where the prompt came from:\n%s", s)
	}
	// The head's heartbeat brings its cache's counters to the
	// coordinator's Prometheus metrics.
	want := map[string]float64{"tandem_coordinator_prefix_cache_hits": 1, "tandem_coordinator_prefix_cache_hit_tokens": 128,
		"tandem_coordinator_prefix_cache_lookups": 2, "tandem_coordinator_prefix_cache_entries": 1}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := map[string]float64{}
		mfs, err := opt.Metrics.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "worker" && l.GetValue() == tm.CachedOn {
						got[mf.GetName()] = m.GetGauge().GetValue()
					}
				}
			}
		}
		ok := got["tandem_coordinator_prefix_cache_bytes"] > 0
		for k, v := range want {
			ok = ok && got[k] == v
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics of %s: %v, want %v and bytes", tm.CachedOn, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMetric waits until the coordinator's gauge name for worker reads want.
func waitMetric(t *testing.T, m *metrics.Metrics, worker, name string, want float64) {
	t.Helper()
	waitGauge(t, m, worker, name, fmt.Sprint(want), func(v float64) bool { return v == want })
}

// waitGauge waits until the gauge name{worker} reads a value ok accepts
// (what says which, for the failure).
func waitGauge(t *testing.T, m *metrics.Metrics, worker, name, what string, ok func(float64) bool) float64 {
	t.Helper()
	ctx := testctx.Context(t)
	for {
		v, found := gauge(t, m, worker, name)
		if found && ok(v) {
			return v
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s{worker=%q} never read %s (last %v)", name, worker, what, v)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// gauge reads the gauge name{worker} now.
func gauge(t *testing.T, m *metrics.Metrics, worker, name string) (float64, bool) {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, x := range mf.GetMetric() {
			for _, l := range x.GetLabel() {
				if l.GetName() == "worker" && l.GetValue() == worker {
					return x.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}
