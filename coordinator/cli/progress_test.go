package cli

import (
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// TestProgressView: the steps a remote job goes through, as the status
// line says them, with the time since submission and in the step.
func TestProgressView(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	p := progressView{start: t0}
	if got := p.status(at(10)); got != "" {
		t.Fatalf("status before any event: %q", got)
	}
	route := &cp.RouteDecision{Policy: cp.PolicyAuto, Target: cp.TargetRemote, PrefillWorker: "prefill-0", DecodeGroup: "g",
		PredictedLocal: 90 * time.Second, PredictedRemote: 40 * time.Second, Reason: "remote is faster"}
	steps := []struct {
		ev   cp.JobEvent
		at   int
		keep []string
		want string
	}{
		{cp.JobEvent{JobID: "j-1", State: cp.StateQueued, Detail: "1000 prompt tokens, up to 16 new"}, 5,
			[]string{"job j-1 queued: 1000 prompt tokens, up to 16 new"}, "   0.0s  queued"},
		{cp.JobEvent{JobID: "j-1", State: cp.StateRouted, Route: route}, 100,
			[]string{"routed remote (policy auto): prefill worker prefill-0 prefills it, decode group g decodes; predicted time to first token: local 1m30s, remote 40s", "  remote is faster"},
			"   0.1s  waiting for a weight pass on prefill-0"},
		{cp.JobEvent{JobID: "j-1", State: cp.StatePrefilling, Route: route, Progress: &cp.LayerProgress{Done: 41, Total: 93}}, 12_300, nil,
			"  12.3s  prefilling on prefill-0: layers 41/93"},
		{cp.JobEvent{JobID: "j-1", State: cp.StateTransferring, Route: route, Progress: &cp.LayerProgress{Done: 92, Total: 93}}, 30_000, nil,
			"  30.0s  transfer to decode group g: layers 92/93 committed"},
		{cp.JobEvent{JobID: "j-1", State: cp.StateDecoding, Route: route}, 30_500, nil, "  30.5s  waiting for the first token"},
	}
	for _, s := range steps {
		keep := p.event(s.ev, at(s.at))
		if strings.Join(keep, "\n") != strings.Join(s.keep, "\n") {
			t.Fatalf("%s: keeps %q, want %q", s.ev.State, keep, s.keep)
		}
		if got := p.status(at(s.at)); got != s.want {
			t.Fatalf("%s: status %q, want %q", s.ev.State, got, s.want)
		}
	}
	// A step that lasts says for how long.
	if got, want := p.status(at(32_600)), "  32.6s  waiting for the first token (2.1s)"; got != want {
		t.Fatalf("status %q, want %q", got, want)
	}
	if got, want := p.firstToken(at(33_000)), "first token after 33s"; got != want {
		t.Fatalf("first token line %q, want %q", got, want)
	}
	// A local job is prefilled by its decode group.
	q := progressView{start: t0}
	q.event(cp.JobEvent{JobID: "j-2", State: cp.StateRouted, Route: &cp.RouteDecision{Target: cp.TargetLocal, DecodeGroup: "g"}}, at(1))
	q.event(cp.JobEvent{JobID: "j-2", State: cp.StatePrefilling, Progress: &cp.LayerProgress{Done: 3, Total: 5}}, at(2))
	if got, want := q.status(at(2)), "   0.0s  prefilling on decode group g: layers 3/5"; got != want {
		t.Fatalf("local: %q, want %q", got, want)
	}
}
