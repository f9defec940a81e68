package service_test

import (
	"context"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/testkit"
)

// TestQueuedJobsListedAfterRestart: jobs waiting in the queue (no decode
// group is up; one of them taken by the coordinator, the others not yet
// delivered) are in the job list of the coordinator that restarts, as
// queued, before any of them is routed.
func TestQueuedJobsListedAfterRestart(t *testing.T) {
	opt := testOptions(t)
	opt.NoPrefill = true
	opt.Coordinator.MaxRunning = 1
	c := startCluster(t, opt)
	nc := connect(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for r := range c.Group.Layout.Ranks {
		if err := c.StopRank(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	for i := range 3 {
		rep, err := cp.Submit(ctx, nc, &cp.SubmitRequest{TokenIDs: testkit.Prompt(5, c.Model.VocabSize, 300+i), Sampling: cp.Sampling{MaxTokens: 4}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rep.JobID)
	}
	if err := c.StopCoordinator(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartCoordinator(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := listJobs(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]cp.JobState{}
	for _, j := range list {
		listed[j.JobID] = j.State
	}
	for _, id := range ids {
		if s, ok := listed[id]; !ok || s != cp.StateQueued {
			t.Errorf("job %s after the restart: listed %v, state %q; want queued", id, ok, s)
		}
	}
}
