package scheduler

import (
	"fmt"

	"github.com/tandem-inference/tandem/prefill-worker/planner"
)

// Step is the pass-start rule's answer for the queue as it is.
type Step struct {
	// Drops are jobs (indices into the input's Jobs) that no pass can take,
	// with why; the caller fails them, then asks again.
	Drops []Drop
	// Run says to start a pass with Plan now.
	Run  bool
	Plan planner.Plan
	// Wait says nothing can run until a committing job's sink queue drains.
	Wait bool
}

// Drop is a job the rule gives up on.
type Drop struct {
	Job int
	Err error
}

// Next is the pass scheduler's pass-start rule, as pure logic so that the
// scheduler and the simulator (bench/sim) run the same rule: the jobs a pass
// could take are listed in progress first, then waiting in arrival order
// (in.Jobs), in.Draining is the memory still held by committing jobs' sink
// queues, and the planner decides which tokens of which jobs the pass takes.
// All jobs waiting at a pass start share it as far as memory allows.
func Next(in planner.Input) Step {
	if len(in.Jobs) == 0 {
		return Step{}
	}
	plan, err := planner.Make(in)
	if err != nil {
		// Not even the first job fits beside the ring: it can never run.
		return Step{Drops: []Drop{{Job: 0, Err: fmt.Errorf("job %s: %w", in.Jobs[0].ID, err)}}}
	}
	var st Step
	for _, r := range plan.Rejected {
		st.Drops = append(st.Drops, Drop{Job: r.Job, Err: fmt.Errorf("job %s: %w: %s", r.ID, planner.ErrBudget, r.Reason)})
	}
	switch {
	case len(plan.Pieces) > 0:
		st.Run, st.Plan = true, plan
	case len(st.Drops) > 0:
		// Ask again without them.
	case in.Draining == 0:
		st.Drops = []Drop{{Job: 0, Err: fmt.Errorf("job %s: no pass can take it (%s)", in.Jobs[0].ID, plan)}}
	default:
		st.Wait = true
	}
	return st
}
