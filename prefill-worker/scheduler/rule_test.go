package scheduler

import (
	"errors"
	"testing"

	"github.com/tandem-inference/tandem/prefill-worker/planner"
)

// ruleCosts: 4 layers of 10 MiB weights, 4 KiB of activations and 2 KiB of
// state per token.
func ruleCosts() planner.Costs {
	return planner.Costs{Layers: 4, SlotBytes: 10 << 20, ActPerToken: 4096, StateFixed: 1 << 20, StatePerToken: 2048,
		TempFixed: 1 << 20, TempPerRow: 16 << 10, TempPerSeq: 64 << 10}
}

func TestNextSharesThePass(t *testing.T) {
	st := Next(planner.Input{Costs: ruleCosts(), Budget: 1 << 30, Depth: -1,
		Jobs: []planner.Job{{ID: "a", Total: 100}, {ID: "b", Total: 50}}})
	if !st.Run || len(st.Plan.Pieces) != 2 || len(st.Drops) != 0 {
		t.Fatalf("step %+v: want one pass taking both jobs", st)
	}
	if st := Next(planner.Input{Costs: ruleCosts(), Budget: 1 << 30, Depth: -1}); st.Run || st.Wait || len(st.Drops) > 0 {
		t.Fatalf("empty queue: %+v", st)
	}
}

func TestNextDropsWhatCanNeverRun(t *testing.T) {
	// The ring alone exceeds the budget: the first job can never run.
	st := Next(planner.Input{Costs: ruleCosts(), Budget: 5 << 20, Depth: -1, Jobs: []planner.Job{{ID: "a", Total: 10}}})
	if st.Run || len(st.Drops) != 1 || st.Drops[0].Job != 0 {
		t.Fatalf("step %+v: want job 0 dropped", st)
	}
	// A prompt whose state alone exceeds what the budget leaves is rejected
	// with ErrBudget; the small one still runs.
	st = Next(planner.Input{Costs: ruleCosts(), Budget: 64 << 20, Depth: 1,
		Jobs: []planner.Job{{ID: "huge", Total: 1 << 20}, {ID: "small", Total: 10}}})
	if !st.Run || len(st.Drops) != 1 || !errors.Is(st.Drops[0].Err, planner.ErrBudget) {
		t.Fatalf("step %+v: want huge rejected with ErrBudget and a pass for small", st)
	}
}

func TestNextWaitsForDrainingMemory(t *testing.T) {
	in := planner.Input{Costs: ruleCosts(), Budget: 40 << 20, Depth: 1, Jobs: []planner.Job{{ID: "a", Total: 64}}}
	free := Next(in)
	if !free.Run {
		t.Fatalf("without draining: %+v", free)
	}
	in.Draining = 19 << 20 // finished jobs' states still queued to their sinks
	st := Next(in)
	if st.Run || !st.Wait || len(st.Drops) != 0 {
		t.Fatalf("step %+v: want to wait for the sinks to drain", st)
	}
}
