package service_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/internal/heldbackend"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
)

// follow runs a job in the background and calls on for each event.
type followed struct {
	res  *client.Result
	err  error
	done chan struct{}
}

func follow(nc *nats.Conn, req cp.SubmitRequest, h client.Handlers) *followed {
	f := &followed{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		f.res, f.err = client.Run(ctx, nc, req, h)
	}()
	return f
}

func (f *followed) wait(t *testing.T, within time.Duration) *client.Result {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(within):
		t.Fatalf("the job did not end within %v", within)
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
	return f.res
}

// onceWhen returns an event handler that calls do once, the first time
// cond holds.
func onceWhen(cond func(cp.JobEvent) bool, do func()) func(cp.JobEvent) {
	var once sync.Once
	return func(ev cp.JobEvent) {
		if cond(ev) {
			once.Do(func() { go do() })
		}
	}
}

// holdPrefillAt makes opt's prefill worker hold its passes at layer (from
// now on, until Resume): the pass reports its earlier layers and then
// waits, so that a test's kill or cancel lands during the prefill whatever
// the machine's speed.
func holdPrefillAt(opt *cluster.Options, layer int) *heldbackend.Backend {
	h := heldbackend.New(cpu.New(max(opt.Threads, 1)), layer, true)
	opt.PrefillBackend = func() kernels.Backend { return h }
	return h
}

// checkFreed waits until the decode group and the prefill worker hold no
// sequence and no state.
func checkFreed(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		busy := ""
		for r := range c.Group.Layout.Ranks {
			if w := c.Group.Worker(r); w != nil {
				if st := w.Stats(); st.Sequences != 0 || st.ReservedBytes != 0 {
					busy = "decode rank holds sequences"
				}
			}
			if s := c.Group.Server(r); s != nil {
				if st := s.Stats(); st.HeldBytes != 0 || st.Sessions != 0 {
					busy = "decode rank's kvtransfer server holds sessions"
				}
			}
		}
		if w := c.PrefillWorker(); w != nil {
			if st := w.Stats(); st.Queued != 0 || st.InProgress != 0 {
				busy = "prefill worker holds jobs"
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("resources not freed after 10 s: %s", busy)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKillPrefillWorkerMidJob: the prefill worker dies during a remote
// prefill: the job fails with a reason that names what broke, within a
// bounded time, the decode group frees its state, and the next job runs
// (locally, or on a restarted prefill worker).
func TestKillPrefillWorkerMidJob(t *testing.T) {
	opt := testOptions(t)
	// The pass reports layer 0 and waits before layer 1 until the job has
	// failed: the kill always lands mid-prefill.
	held := holdPrefillAt(&opt, 1)
	defer held.Resume()
	c := startCluster(t, opt)
	nc := connect(t, c)
	p := testkit.Prompt(2000, c.Model.VocabSize, 3)
	var killed time.Time
	var mu sync.Mutex
	gone := make(chan struct{})
	f := follow(nc, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: 4}, Policy: cp.PolicyRemote},
		client.Handlers{Event: onceWhen(func(ev cp.JobEvent) bool {
			return ev.State == cp.StatePrefilling && ev.Progress != nil && ev.Progress.Done >= 1
		}, func() {
			defer close(gone)
			mu.Lock()
			killed = time.Now()
			mu.Unlock()
			c.KillPrefill() // returns once the held pass is released
		})})
	res := f.wait(t, 30*time.Second)
	held.Resume()
	mu.Lock()
	took := res.Final.Time.Sub(killed)
	mu.Unlock()
	if killed.IsZero() {
		t.Fatalf("the job ended (%s) before prefill progress was seen", res.Final.State)
	}
	e := res.Final.Error
	if res.Final.State != cp.StateFailed || e == nil || e.Worker == "" || e.Message == "" {
		t.Fatalf("after the prefill worker died: %+v", res.Final)
	}
	if bound := 2*time.Second + 2*time.Second; took > bound {
		t.Fatalf("the job failed %v after the kill, want within %v (registry TTL + slack)", took, bound)
	}
	t.Logf("failed %v after the kill: %v", took.Round(time.Millisecond), e)
	<-gone
	checkFreed(t, c)

	// New jobs still run: locally at once, remotely on a new prefill worker.
	ref := testmodel.LoadReference(t, opt.ModelDir, 1)
	short := testkit.Prompt(9, c.Model.VocabSize, 4)
	checkDone(t, run(t, nc, cp.SubmitRequest{TokenIDs: short, Sampling: cp.Sampling{MaxTokens: 5}}), ref.Greedy(t, short, 5), cp.TargetLocal)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.StartPrefill(ctx); err != nil {
		t.Fatal(err)
	}
	checkDone(t, run(t, nc, cp.SubmitRequest{TokenIDs: short, Sampling: cp.Sampling{MaxTokens: 5}, Policy: cp.PolicyRemote}),
		ref.Greedy(t, short, 5), cp.TargetRemote)
}

// TestKillDecodeRankMidJob: a decode rank dies while a job decodes. Rank 1
// dying breaks the ring: rank 0 ends the job with the lost link named.
// Rank 0 dying takes the group's front door: the registry notices the
// silence and the coordinator fails the job naming rank 0. Either way the
// job ends within a bounded time and, with the rank back, jobs run again.
func TestKillDecodeRankMidJob(t *testing.T) {
	opt := testOptions(t)
	c := startCluster(t, opt)
	nc := connect(t, c)
	ref := testmodel.LoadReference(t, opt.ModelDir, 1)
	for _, victim := range []int{1, 0} {
		var killed time.Time
		var mu sync.Mutex
		// Killed once the client has a few tokens: mid-decode.
		var kill sync.Once
		f := follow(nc, cp.SubmitRequest{TokenIDs: testkit.Prompt(20, c.Model.VocabSize, 5), Sampling: cp.Sampling{MaxTokens: 30000}},
			client.Handlers{Token: func(tm cp.TokenMsg) {
				if tm.Index < 5 {
					return
				}
				kill.Do(func() {
					go func() {
						mu.Lock()
						killed = time.Now()
						mu.Unlock()
						c.KillRank(victim)
					}()
				})
			}})
		res := f.wait(t, 30*time.Second)
		mu.Lock()
		took := res.Final.Time.Sub(killed)
		mu.Unlock()
		e := res.Final.Error
		if killed.IsZero() || res.Final.State != cp.StateFailed || e == nil || e.Worker == "" {
			t.Fatalf("rank %d killed: %+v", victim, res.Final)
		}
		// Rank 0's silence is noticed within the registry TTL (2 s) and a
		// quarter; the rest is slack for a loaded machine.
		if bound := 2*time.Second + 2*time.Second; took > bound {
			t.Fatalf("rank %d killed: the job failed %v later, want within %v", victim, took, bound)
		}
		if victim == 0 && e.Worker != c.RankID(0) {
			t.Fatalf("rank 0 killed: the failure names %q: %v", e.Worker, e)
		}
		t.Logf("rank %d killed: failed %v later, after %d tokens: %v", victim, took.Round(time.Millisecond), len(res.Tokens), e)

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := c.StartRank(ctx, victim); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		checkFreed(t, c)
		short := testkit.Prompt(6, c.Model.VocabSize, 6)
		checkDone(t, run(t, nc, cp.SubmitRequest{TokenIDs: short, Sampling: cp.Sampling{MaxTokens: 5}, Policy: cp.PolicyLocal}),
			ref.Greedy(t, short, 5), cp.TargetLocal)
	}
}

// TestWorkerLostWithItsAssignmentUnanswered: a worker that dies holding an
// assignment it has not answered fails the job as soon as the registry
// loses it, not at the assignment timeout, naming the worker and the loss;
// the decode group that admitted the job frees it. (Rank 0 of a decode
// group can stream a job's first tokens before its answer goes out: a
// rank 0 killed then left its job to the 10 s assignment timeout.) Here a
// mute prefill worker takes the job's prefill assignment and dies.
func TestWorkerLostWithItsAssignmentUnanswered(t *testing.T) {
	opt := testOptions(t)
	opt.Coordinator.AssignTimeout = 10 * time.Minute // only the loss can end the job within the test
	c := startCluster(t, opt)
	nc := connect(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The only prefill worker is the mute one: it answers status probes
	// (it knows no job) and takes assignments without a word.
	c.KillPrefill()
	const mute = "mute-prefill"
	wc, err := c.ConnectAs(ctx, cp.PrincipalWorker, mute)
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	reg, err := cp.JoinRegistry(ctx, wc, opt.Registry.Bucket, nil) // a worker identity joins, never configures
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	hb, err := cp.StartHeartbeat(ctx, reg, 0, func() cp.WorkerInfo {
		return cp.WorkerInfo{ID: mute, Kind: cp.KindPrefill, Backend: "cpu", Model: c.Model.ID, Started: started, Time: time.Now()}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hb.Stop(ctx) }()
	if _, err := cp.Serve(ctx, wc, cp.WorkerStatus(mute), "", func(_ context.Context, req *cp.JobStatusRequest) (*cp.JobStatusReply, error) {
		return &cp.JobStatusReply{JobID: req.JobID, WorkerID: mute}, nil
	}); err != nil {
		t.Fatal(err)
	}
	taken := make(chan struct{})
	var once sync.Once
	if _, err := wc.Subscribe(cp.WorkerAssign(mute), func(*nats.Msg) { once.Do(func() { close(taken) }) }); err != nil {
		t.Fatal(err)
	}
	if err := wc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}

	f := follow(nc, cp.SubmitRequest{TokenIDs: testkit.Prompt(50, c.Model.VocabSize, 9), Sampling: cp.Sampling{MaxTokens: 4}, Policy: cp.PolicyRemote}, client.Handlers{})
	select {
	case <-taken:
	case <-f.done:
		t.Fatalf("the job ended before the mute worker had its assignment: %+v %v", f.res, f.err)
	}
	wc.Close() // dead, the assignment unanswered: its heartbeat stops
	res := f.wait(t, time.Minute)
	e := res.Final.Error
	if res.Final.State != cp.StateFailed || e == nil || e.Worker != mute || !strings.Contains(e.Message, "heartbeat") {
		t.Fatalf("after the mute worker died: %+v, error %+v", res.Final, e)
	}
	t.Logf("failed: %v", e)
	checkFreed(t, c)
}

// TestCancelReachesEveryWorker: cancelling a decoding job and a job in its
// remote prefill ends them cancelled and frees the memory on every worker.
func TestCancelReachesEveryWorker(t *testing.T) {
	opt := testOptions(t)
	// A remote pass waits before layer 1 until the job is cancelled: the
	// cancellation always lands mid-prefill.
	held := holdPrefillAt(&opt, 1)
	defer held.Resume()
	c := startCluster(t, opt)
	nc := connect(t, c)
	for _, tc := range []struct {
		name   string
		req    cp.SubmitRequest
		cancel func(cp.JobEvent) bool
	}{
		{"decoding", cp.SubmitRequest{TokenIDs: testkit.Prompt(10, c.Model.VocabSize, 7), Sampling: cp.Sampling{MaxTokens: 30000}, Policy: cp.PolicyLocal},
			func(ev cp.JobEvent) bool { return ev.State == cp.StateDecoding }},
		{"prefilling", cp.SubmitRequest{TokenIDs: testkit.Prompt(2000, c.Model.VocabSize, 8), Sampling: cp.Sampling{MaxTokens: 4}, Policy: cp.PolicyRemote},
			func(ev cp.JobEvent) bool {
				return ev.State == cp.StatePrefilling && ev.Progress != nil && ev.Progress.Done >= 1
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held.Hold()
			defer held.Resume()
			tc.req.IdempotencyKey = "cancel-" + cp.NewJobID()
			var rep *cp.CancelReply
			var repErr error
			cancelled := make(chan struct{})
			f := follow(nc, tc.req, client.Handlers{Event: onceWhen(tc.cancel, func() {
				defer close(cancelled)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				rep, repErr = cp.Cancel(ctx, nc, cp.JobIDForKey(cp.ClientName(nc), tc.req.IdempotencyKey), "test cancels")
			})})
			res := f.wait(t, 30*time.Second)
			held.Resume()
			select {
			case <-cancelled:
			case <-time.After(20 * time.Second):
				t.Fatal("no answer to the cancellation")
			}
			if repErr != nil || rep == nil || rep.State != cp.StateCancelled {
				t.Fatalf("cancel reply %+v, %v", rep, repErr)
			}
			if res.Final.State != cp.StateCancelled {
				t.Fatalf("job ended %s: %+v", res.Final.State, res.Final)
			}
			checkFreed(t, c)
		})
	}
}
