package service_test

import (
	"context"
	"slices"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestWorkersAdmitAJobOnce: a decode group and a prefill worker answer an
// assignment of a job they run, or ran, with what they have of it
// (resumed), and start nothing; their status says the same without
// changing anything. This is what a coordinator that takes over a job
// after a crash relies on.
func TestWorkersAdmitAJobOnce(t *testing.T) {
	opt := testOptions(t)
	c := startCluster(t, opt)
	nc := connect(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	head := c.RankID(0)
	long := prompt(200, c.Model.VocabSize, 3)
	want := testmodel.LoadReference(t, opt.ModelDir, 1).Greedy(t, long, 400)

	// A long job, followed while it decodes.
	decoding := make(chan string, 1)
	done := make(chan *client.Result, 1)
	go func() {
		res, err := client.Run(ctx, nc, cp.SubmitRequest{TokenIDs: long, Sampling: cp.Sampling{MaxTokens: 400}, Policy: cp.PolicyRemote},
			client.Handlers{Event: func(ev cp.JobEvent) {
				if ev.State == cp.StateDecoding {
					select {
					case decoding <- ev.JobID:
					default:
					}
				}
			}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	var job string
	select {
	case job = <-decoding:
	case res := <-done:
		t.Fatalf("the job ended before it decoded: %+v", res)
	}
	admitted := c.Group.Head().Stats().Admitted
	completed := c.PrefillWorker().Stats().Completed

	st, err := cp.JobStatus(ctx, nc, head, job)
	if err != nil || !st.Held || st.Progress == nil || st.Progress.JobID != job {
		t.Fatalf("status of a running job on the decode group: %+v %v", st, err)
	}
	// The same job id assigned again, with another transfer session.
	reg, err := cp.OpenRegistry(ctx, nc, opt.Registry)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := reg.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := cp.Assignment{JobID: job, Role: cp.RoleDecode, WorkerID: head, GroupID: "local", TokenIDs: long[len(long)-1:],
		CachedTokens: len(long) - 1, Sampling: cp.Sampling{MaxTokens: 400}}
	session, secret := cp.NewSessionID(), cp.NewSecret()
	for r := range 2 {
		for _, w := range ws {
			if w.ID == c.RankID(r) {
				a.Placement = append(a.Placement, cp.LayerPlacement{Rank: r, WorkerID: w.ID, Layers: w.Layers,
					Transfer: w.Endpoints.Transfer, Pipeline: w.Endpoints.Pipeline, SessionID: session, Secret: secret})
			}
		}
	}
	var rep cp.AssignReply
	if err := cp.Request(ctx, nc, cp.WorkerAssign(head), &a, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Accepted || !rep.Resumed || rep.Progress == nil || rep.Progress.Stage.Final() {
		t.Fatalf("a repeated assignment of a running job: %+v", rep)
	}
	pre := a
	pre.Role, pre.WorkerID, pre.TokenIDs, pre.CachedTokens = cp.RolePrefill, "prefill-0", long[:len(long)-1], 0
	var prep cp.AssignReply
	if err := cp.Request(ctx, nc, cp.WorkerAssign("prefill-0"), &pre, &prep); err != nil {
		t.Fatal(err)
	}
	// The state is committed (the group decodes): the prefill worker has
	// ended the job, or is just putting it away.
	if !prep.Accepted || !prep.Resumed || prep.Progress == nil ||
		(prep.Progress.Stage != cp.StateDone && prep.Progress.Stage != cp.StateTransferring) {
		t.Fatalf("a repeated assignment of a job the prefill worker prefilled: %+v", prep)
	}

	res := <-done
	checkDone(t, res, want, cp.TargetRemote)
	// Ended: the final report, with the whole output (once rank 0 has put
	// the stream away, just after its final report went out).
	for {
		st, err = cp.JobStatus(ctx, nc, head, job)
		if err != nil || !st.Held {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the decode group still holds the job after its end")
		case <-time.After(10 * time.Millisecond): // polling with a deadline
		}
	}
	if err != nil || st.Held || !st.Finished() || st.Progress.Stage != cp.StateDone || st.Progress.Output == nil ||
		!slices.Equal(st.Progress.Output.TokenIDs, res.Tokens) {
		t.Fatalf("status of an ended job: %+v %v", st, err)
	}
	rep = cp.AssignReply{}
	if err := cp.Request(ctx, nc, cp.WorkerAssign(head), &a, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Accepted || !rep.Resumed || rep.Progress == nil || rep.Progress.Stage != cp.StateDone {
		t.Fatalf("a repeated assignment of an ended job: %+v", rep)
	}
	if got := c.Group.Head().Stats().Admitted; got != admitted {
		t.Fatalf("the decode group admitted %d sequences since the job started, want none", got-admitted)
	}
	if got := c.PrefillWorker().Stats().Completed; got != completed {
		t.Fatalf("the prefill worker completed %d more jobs, want none", got-completed)
	}
	// A job the workers never saw: not held, nothing known.
	st, err = cp.JobStatus(ctx, nc, "prefill-0", "j-never")
	if err != nil || st.Held || st.Progress != nil {
		t.Fatalf("status of an unknown job: %+v %v", st, err)
	}
}
