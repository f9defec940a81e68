package service

import (
	"strings"
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
)

// TestAvailabilityOf: what a client's availability request is answered
// from the registry: usable decode groups only (as placement sees them),
// with the reasons the others are not, and the model's live prefill
// workers.
func TestAvailabilityOf(t *testing.T) {
	m := &modelinfo.Info{ID: "m1", NumLayers: 4, MaxPositions: 1000}
	rank := func(id, group string, r, size, lo, hi int) cp.WorkerInfo {
		return cp.WorkerInfo{ID: id, Kind: cp.KindDecode, Model: "m1", GroupID: group, Rank: r, GroupSize: size,
			Layers: cp.LayerRange{First: lo, End: hi}}
	}
	workers := map[string]cp.WorkerInfo{}
	rep := availabilityOf(workers, m)
	if ok, why := rep.Available(); ok || rep.Model != "m1" || !strings.Contains(why, "no decode group of model m1") {
		t.Fatalf("no workers: %+v, %q", rep, why)
	}
	for _, w := range []cp.WorkerInfo{
		rank("a0", "a", 0, 2, 0, 2), rank("a1", "a", 1, 2, 2, 4), // usable
		rank("b0", "b", 0, 2, 0, 2), // its rank 1 is missing
		{ID: "p1", Kind: cp.KindPrefill, Model: "m1"},
		{ID: "p2", Kind: cp.KindPrefill, Model: "m1", Draining: true},
		{ID: "p3", Kind: cp.KindPrefill, Model: "other"},
	} {
		workers[w.ID] = w
	}
	rep = availabilityOf(workers, m)
	if err := rep.Validate(); err != nil {
		t.Fatal(err)
	}
	if rep.DecodeGroups != 1 || rep.DecodeRanks != 2 || rep.PrefillWorkers != 1 || rep.MaxTokens != 1000 {
		t.Fatalf("availability %+v", rep)
	}
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "group b") {
		t.Fatalf("problems %q, want group b's", rep.Problems)
	}
	if ok, _ := rep.Available(); !ok {
		t.Fatal("a usable group, not available")
	}

	// Many broken groups: the reply stays within the protocol's bound.
	for i := range 100 {
		w := rank("x"+string(rune('A'+i%26))+string(rune('a'+i/26)), "x"+string(rune('A'+i%26))+string(rune('a'+i/26)), 0, 2, 0, 2)
		workers[w.ID] = w
	}
	rep = availabilityOf(workers, m)
	if err := rep.Validate(); err != nil || len(rep.Problems) != maxReportedProblems || !strings.Contains(rep.Problems[maxReportedProblems-1], "more") {
		t.Fatalf("%d problems, last %q: %v", len(rep.Problems), rep.Problems[len(rep.Problems)-1], err)
	}
}
