package service_test

import (
	"context"
	"slices"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/internal/testkit"
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
	// Workers take assignments and status requests from the coordinator's
	// identity only.
	co, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "test-coordinator")
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	head := c.RankID(0)
	long := testkit.Prompt(200, c.Model.VocabSize, 3)
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

	st, err := cp.JobStatus(ctx, co, head, job)
	if err != nil || !st.Held || st.Progress == nil || st.Progress.JobID != job {
		t.Fatalf("status of a running job on the decode group: %+v %v", st, err)
	}
	// The same job id assigned again, with another transfer session.
	reg, err := cp.OpenRegistry(ctx, co, opt.Registry)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := reg.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := cp.Assignment{JobID: job, Role: cp.RoleDecode, WorkerID: head, GroupID: "local", Client: cp.ClientName(nc), TokenIDs: long[len(long)-1:],
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
	if err := cp.Request(ctx, co, cp.WorkerAssign(head), &a, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Accepted || !rep.Resumed || rep.Progress == nil || rep.Progress.Stage.Final() {
		t.Fatalf("a repeated assignment of a running job: %+v", rep)
	}
	pre := a
	pre.Role, pre.WorkerID, pre.TokenIDs, pre.CachedTokens = cp.RolePrefill, "prefill-0", long[:len(long)-1], 0
	var prep cp.AssignReply
	if err := cp.Request(ctx, co, cp.WorkerAssign("prefill-0"), &pre, &prep); err != nil {
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
	// Ended: the final report, with the whole output (once rank 0 and the
	// prefill worker have put the job away, just after their final
	// reports went out).
	for {
		st, err = cp.JobStatus(ctx, co, head, job)
		pst, perr := cp.JobStatus(ctx, co, "prefill-0", job)
		if err != nil || perr != nil || (!st.Held && !pst.Held) {
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
	if err := cp.Request(ctx, co, cp.WorkerAssign(head), &a, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Accepted || !rep.Resumed || rep.Progress == nil || rep.Progress.Stage != cp.StateDone {
		t.Fatalf("a repeated assignment of an ended job: %+v", rep)
	}
	// The only job of this cluster, admitted and prefilled once.
	if got := c.Group.Head().Stats().Admitted; got != 1 {
		t.Fatalf("the decode group admitted %d sequences, want 1", got)
	}
	if st := c.PrefillWorker().Stats(); st.Completed != 1 || st.InProgress != 0 || st.Queued != 0 {
		t.Fatalf("the prefill worker: %+v, want 1 job completed and nothing else", st)
	}
	// A job the workers never saw: not held, nothing known.
	st, err = cp.JobStatus(ctx, co, "prefill-0", "j-never")
	if err != nil || st.Held || st.Progress != nil {
		t.Fatalf("status of an unknown job: %+v %v", st, err)
	}
}
