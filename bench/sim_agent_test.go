package main

import (
	"testing"

	"github.com/tandem-inference/tandem/bench/sim"
)

// TestAgentTurn: a 300k-token session's next turn at K3 scale, priced by
// the router's cost model: without caches the same figures as the
// simulator's idle projection (the box wins); with both caches holding the
// history the Macs serve the 1k new tokens themselves, far sooner.
func TestAgentTurn(t *testing.T) {
	m, err := sim.LoadModel("k3")
	if err != nil {
		t.Fatal(err)
	}
	macs, err := sim.LoadProfile("m3ultra-x4")
	if err != nil {
		t.Fatal(err)
	}
	box, err := sim.LoadProfile("h200")
	if err != nil {
		t.Fatal(err)
	}
	link, err := sim.LoadProfile("10gbe")
	if err != nil {
		t.Fatal(err)
	}
	alone, err := sim.NewSetup(m, nil, macs, nil)
	if err != nil {
		t.Fatal(err)
	}
	both, err := sim.NewSetup(m, box, macs, link)
	if err != nil {
		t.Fatal(err)
	}
	a := agentTurn(alone, 300000, 1000)
	if a.TargetNo != "local" || a.TargetCache != "local" || a.CacheS*50 > a.NoCacheS || a.CachedTokens != 299968 {
		t.Fatalf("the Macs alone: %+v", a)
	}
	b := agentTurn(both, 300000, 1000)
	if b.TargetNo != "remote" || b.TargetCache != "local" || b.CacheS >= b.NoCacheS || b.CacheS != a.CacheS {
		t.Fatalf("H200 + Macs: %+v (the Macs alone with the cache: %v s)", b, a.CacheS)
	}
	// The idle projection of a 301k prompt on the H200 setup agrees.
	j, err := sim.Idle(t.Context(), both, "auto", 301000)
	if err != nil {
		t.Fatal(err)
	}
	if d := j.TTFT.Seconds() - b.NoCacheS; d > 0.02*b.NoCacheS || d < -0.02*b.NoCacheS {
		t.Fatalf("simulated %v s, the cost model %v s", j.TTFT.Seconds(), b.NoCacheS)
	}
}
