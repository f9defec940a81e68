package service_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kvtransfer"
)

// testOptions are a cluster on the tiny preset with timeouts short enough
// for failure tests.
func testOptions(t testing.TB) cluster.Options {
	t.Helper()
	return cluster.Options{
		ModelDir: testmodel.Dir(t, "tiny", 1, 2),
		Queue:    cp.QueueConfig{Memory: true, AckWait: 3 * time.Second},
		Registry: cp.RegistryConfig{Memory: true, TTL: 2 * time.Second},
		Coordinator: service.Config{AssignTimeout: 10 * time.Second, PlacementWait: 10 * time.Second,
			StallTimeout: 10 * time.Second, ShutdownGrace: 2 * time.Second,
			// The tiny model on this machine, roughly (measured jobs refine it).
			Rates:              router.Rates{PassFloor: 20 * time.Millisecond, LinkBytesPerS: 1e9, DecodeStep: 2 * time.Millisecond},
			SeedPrefillTokPerS: 3000, SeedLocalTokPerS: 2500},
		Threads:       1,
		MeshHeartbeat: 100 * time.Millisecond, MeshIdle: 2 * time.Second,
		Transfer: kvtransfer.Timeouts{Handshake: 2 * time.Second, IO: 3 * time.Second, Idle: 3 * time.Second,
			KeepAlive: 200 * time.Millisecond},
		Log: testkit.Logger(t),
	}
}

func startCluster(t *testing.T, opt cluster.Options) *cluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := cluster.Start(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Logf("cluster close: %v", err)
		}
	})
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func connect(t *testing.T, c *cluster.Cluster) *nats.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := c.Connect(ctx, "test-client")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func run(t *testing.T, nc *nats.Conn, req cp.SubmitRequest) *client.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := client.Run(ctx, nc, req, client.Handlers{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// checkDone checks a job finished with the reference's tokens, routed as
// wanted, with a consistent event history.
func checkDone(t *testing.T, res *client.Result, want []int32, target cp.Target) {
	t.Helper()
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	f := res.Final
	if f.State != cp.StateDone {
		t.Fatalf("job %s ended %s: %+v", res.JobID, f.State, f)
	}
	if !slices.Equal(res.Tokens, want) {
		t.Fatalf("job %s (%s): tokens\n got %v\nwant %v (monolithic model)", res.JobID, target, res.Tokens, want)
	}
	if res.Finish != cp.FinishLength {
		t.Fatalf("finish reason %q, want length", res.Finish)
	}
	if f.Route == nil || f.Route.Target != target || f.Route.PredictedLocal <= 0 {
		t.Fatalf("route %+v, want target %s with predictions", f.Route, target)
	}
	if target == cp.TargetRemote && (f.Route.PredictedRemote <= 0 || f.Route.PrefillWorker == "") {
		t.Fatalf("remote route without its prediction or worker: %+v", f.Route)
	}
	tm := f.Timing
	if tm == nil || tm.FirstToken <= 0 || tm.Total < tm.FirstToken || tm.OutputTokens != len(want) || tm.Prefill <= 0 {
		t.Fatalf("timing %+v", tm)
	}
	if target == cp.TargetRemote && tm.PassWait < 0 {
		t.Fatalf("remote timing %+v", tm)
	}
	var states []cp.JobState
	for i, ev := range res.Events {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: %v", i, ev.Seq, res.Events)
		}
		if len(states) == 0 || states[len(states)-1] != ev.State {
			states = append(states, ev.State)
		}
	}
	wantStates := []cp.JobState{cp.StateQueued, cp.StateRouted, cp.StatePrefilling, cp.StateDecoding, cp.StateDone}
	if target == cp.TargetRemote {
		wantStates = []cp.JobState{cp.StateQueued, cp.StateRouted, cp.StatePrefilling, cp.StateTransferring, cp.StateDecoding, cp.StateDone}
	}
	if !slices.Equal(states, wantStates) {
		t.Fatalf("states %v, want %v", states, wantStates)
	}
}

// TestShortAndLongJobs: a short prompt prefilled by the decode group and a
// long one prefilled by the prefill worker and transferred both generate
// the monolithic model's tokens, on the embedded server and on a real
// nats-server process.
func TestShortAndLongJobs(t *testing.T) {
	for _, kind := range []string{"embedded", "process"} {
		t.Run(kind, func(t *testing.T) {
			opt := testOptions(t)
			if kind == "process" {
				opt.NATSURL, opt.Identities = secureProcess(t, cp.NewIdentities())
			}
			c := startCluster(t, opt)
			ref := testmodel.LoadReference(t, opt.ModelDir, 1)
			nc := connect(t, c)
			short, long := testkit.Prompt(7, c.Model.VocabSize, 1), testkit.Prompt(300, c.Model.VocabSize, 2)

			res := run(t, nc, cp.SubmitRequest{TokenIDs: short, Sampling: cp.Sampling{MaxTokens: 12}, Policy: cp.PolicyLocal})
			checkDone(t, res, ref.Greedy(t, short, 12), cp.TargetLocal)
			res = run(t, nc, cp.SubmitRequest{TokenIDs: long, Sampling: cp.Sampling{MaxTokens: 12}, Policy: cp.PolicyRemote})
			checkDone(t, res, ref.Greedy(t, long, 12), cp.TargetRemote)
			t.Logf("%s: remote job %s: %+v", kind, res.JobID, *res.Final.Timing)
		})
	}
}

var _ = fmt.Sprint

// secureProcess runs a real nats-server whose users are ids, with the
// permissions `coordinator credentials --nats-server-conf` writes, and
// returns its URL and ids.
func secureProcess(t *testing.T, ids []cp.Identity) (string, []cp.Identity) {
	t.Helper()
	block, err := cp.ServerAuthorization(ids)
	if err != nil {
		t.Fatal(err)
	}
	coord := cp.Find(ids, cp.PrincipalCoordinator)
	url := natstest.Start(t, natstest.Config{Extra: block, Ready: func(url string) error {
		nc, err := nats.Connect(url, nats.UserInfo(coord.User, coord.Password), nats.Timeout(2*time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		_, err = nc.Request("$JS.API.INFO", nil, 2*time.Second)
		return err
	}})
	return url, ids
}

// clientCLI are the nats CLI's flags that log in as the cluster's client
// "local" with its own reply inbox.
func clientCLI(t *testing.T, c *cluster.Cluster) []string {
	t.Helper()
	id := cp.Find(c.Identities(), cp.PrincipalClient)
	if id == nil {
		t.Fatal("the cluster has no client identity")
	}
	return []string{"--user", id.User, "--password", id.Password, "--inbox-prefix", cp.InboxPrefix(cp.PrincipalClient, id.Name)}
}
