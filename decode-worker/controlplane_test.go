package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tandem-inference/tandem/configs"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// deployment is a control plane for decode-worker processes: a server that
// admits only tandem's identities, a coordinator, and connections as the
// coordinator and as a client.
type deployment struct {
	url         string
	coord, cl   *nats.Conn
	creds       string // the worker identity's file
	model       *modelinfo.Info
	reg         *cp.Registry
	coordinator *service.Coordinator
}

func startDeployment(ctx context.Context, t *testing.T, dir string) *deployment {
	t.Helper()
	ids := cp.NewIdentities()
	srv, err := cp.StartServer(ctx, cp.ServerConfig{Identities: ids})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return newDeployment(ctx, t, dir, srv.ClientURL(), ids)
}

// newDeployment sets up a deployment on the server at url; with ids nil
// the server admits anyone (a plain nats-server on loopback) and the ranks
// connect without credentials.
func newDeployment(ctx context.Context, t *testing.T, dir, url string, ids []cp.Identity) *deployment {
	t.Helper()
	d := &deployment{url: url}
	var err error
	for _, x := range []struct {
		nc **nats.Conn
		p  cp.Principal
	}{{&d.coord, cp.PrincipalCoordinator}, {&d.cl, cp.PrincipalClient}} {
		if *x.nc, err = cp.Connect(ctx, cp.Options{URL: d.url, Identity: cp.Find(ids, x.p)}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup((*x.nc).Close)
	}
	if ids != nil {
		d.creds = filepath.Join(t.TempDir(), "worker.json")
		if err := cp.SaveIdentity(d.creds, cp.Find(ids, cp.PrincipalWorker)); err != nil {
			t.Fatal(err)
		}
	}
	if d.model, err = modelinfo.Load(dir); err != nil {
		t.Fatal(err)
	}
	reg := cp.RegistryConfig{TTL: 2 * time.Second}
	co, err := service.New(d.coord, service.Config{Model: d.model, Queue: cp.QueueConfig{Memory: true}, Registry: reg, ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- co.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-co.Ready():
	case err := <-done:
		t.Fatalf("the coordinator ended: %v", err)
	}
	d.coordinator = co
	if d.reg, err = cp.OpenRegistry(ctx, d.coord, reg); err != nil {
		t.Fatal(err)
	}
	return d
}

// group starts a decode group of ranks processes in the deployment's
// control plane, with extra flags.
func (d *deployment) group(t *testing.T, dir string, ranks int, extra ...string) *cluster {
	t.Helper()
	flags := []string{"--nats-url", d.url, "--registry-ttl", "2s"}
	if d.creds != "" {
		flags = append(flags, "--nats-credentials", d.creds)
	}
	return startCluster(t, dir, ranks, nil, append(flags, extra...)...)
}

// waitRegistered waits until ranks ranks of group ptest are registered
// ready for the deployment's model, and until rank 0 serves its subjects
// (a rank registers before it subscribes: its status subject, subscribed
// after its assign and cancel subjects on the same connection, answers).
func (d *deployment) waitRegistered(ctx context.Context, t *testing.T, ranks int) {
	t.Helper()
	for {
		ws, _ := d.reg.List(ctx)
		ready := 0
		for _, w := range ws {
			if w.Kind == cp.KindDecode && w.GroupID == "ptest" && !w.Draining && w.Model == d.model.ID {
				ready++
			}
		}
		if ready == ranks {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the ranks did not register ready: %v", ws)
		case <-time.After(50 * time.Millisecond):
		}
	}
	for {
		if _, err := d.coord.RequestWithContext(ctx, cp.WorkerStatus("ptest-r0"), nil); !errors.Is(err, nats.ErrNoResponders) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("rank 0 never served its subjects")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestControlPlaneMode: decode-worker processes started with --nats-url
// and the worker identity (--nats-credentials) register in the worker
// registry of a server that admits only tandem's identities, rank 0 takes
// a coordinator's job and publishes its tokens (the monolithic model's) to
// the job's client, and a rank stopping deregisters.
func TestControlPlaneMode(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	ctx := testctx.Context(t)
	d := startDeployment(ctx, t, dir)
	c := d.group(t, dir, 2)
	d.waitRegistered(ctx, t, 2)

	// Malformed requests on rank 0's subjects are answered, not dropped.
	for _, subject := range []string{cp.WorkerAssign("ptest-r0"), cp.WorkerCancel("ptest-r0"), cp.WorkerDrain("ptest-r0")} {
		if err := natstest.MalformedAnswered(ctx, d.coord, subject); err != nil {
			t.Error(err)
		}
	}

	p := testkit.Prompt(9, ref.Cfg.VocabSize, 7)
	res, err := client.Run(ctx, d.cl, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: 6}}, client.Handlers{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Final.State != cp.StateDone || !slices.Equal(res.Tokens, ref.Greedy(t, p, 6)) {
		t.Fatalf("job: %+v, tokens %v", res.Final, res.Tokens)
	}
	if res.Final.Route == nil || res.Final.Route.DecodeGroup != "ptest" {
		t.Fatalf("route %+v", res.Final.Route)
	}

	c.stop()
	for {
		ws, _ := d.reg.List(ctx)
		if len(ws) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stopped ranks still registered: %v", ws)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestDrainRankWithAJobInFlight: a decode group of two processes in
// control-plane mode is asked to drain one rank (as `coordinator drain`
// does) while a job decodes on it, rank 0 (the group's head) or rank 1
// (the last). The drained rank says it holds the job's sequence, the
// registry shows it draining at once (so the coordinator routes nothing
// more to the group), the job finishes with the monolithic model's tokens,
// admitted and run once, and the rank then deregisters (gone from the
// registry, not expired) and exits 0 by itself, saying why in its log.
func TestDrainRankWithAJobInFlight(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	const n = 160
	p := testkit.Prompt(9, ref.Cfg.VocabSize, 11)
	want := ref.Greedy(t, p, n)
	for _, drained := range []int{0, 1} {
		t.Run(fmt.Sprintf("rank%d", drained), func(t *testing.T) {
			ctx := testctx.Context(t)
			d := startDeployment(ctx, t, dir)
			changes, err := d.reg.Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := d.group(t, dir, 2, "--log-format", "json", "--drain-grace", "2m", "--shutdown-grace", "10s")
			d.waitRegistered(ctx, t, 2)
			id := fmt.Sprintf("ptest-r%d", drained)

			// Drain as soon as the job decodes.
			replies := make(chan *cp.DrainReply, 1)
			var asked bool
			res, err := client.Run(ctx, d.cl, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: n}}, client.Handlers{
				Event: func(ev cp.JobEvent) {
					if ev.State != cp.StateDecoding || asked {
						return
					}
					asked = true
					rep, err := cp.Drain(ctx, d.coord, id, "test")
					if err != nil {
						t.Errorf("drain %s: %v", id, err)
					}
					replies <- rep
				}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Final.State != cp.StateDone || !slices.Equal(res.Tokens, want) {
				t.Fatalf("the job in flight during the drain: %+v: tokens %v\nwant %v", res.Final, res.Tokens, want)
			}
			if !asked {
				t.Fatal("the job never reported decoding")
			}
			if rep := <-replies; rep == nil || rep.WorkerID != id || rep.Running != 1 {
				t.Fatalf("drain reply %+v: want %s holding the job's sequence", rep, id)
			}

			// The registry: draining, then deleted (a clean exit).
			var sawDraining bool
			for left := false; !left; {
				select {
				case ch, ok := <-changes:
					if !ok {
						t.Fatal("the registry watch ended")
					}
					if ch.ID != id {
						continue
					}
					switch ch.Op {
					case cp.WorkerUp:
						sawDraining = sawDraining || ch.Info.Draining
					case cp.WorkerLeft:
						left = true
					default:
						t.Fatalf("%s: registry change %s, want it to leave cleanly", id, ch.Op)
					}
				case <-ctx.Done():
					t.Fatalf("%s did not leave the registry", id)
				}
			}
			if !sawDraining {
				t.Fatalf("the registry never showed %s draining before it left", id)
			}
			pr := c.procs[drained]
			select {
			case <-pr.done:
			case <-ctx.Done():
				t.Fatalf("%s did not exit after its drain", id)
			}
			if code := pr.cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("%s exited %d", id, code)
			}
			c.procs[drained] = nil // exited: nothing to stop

			log := pr.out.String()
			for _, line := range []string{`"msg":"drain requested: draining, then exiting"`, `"msg":"draining: no new jobs"`,
				`"msg":"left the control plane: deregistered"`} {
				if !strings.Contains(log, line) {
					t.Errorf("%s's log lacks %s", id, line)
				}
			}
			if strings.Contains(log, "drain grace over") {
				t.Errorf("%s cancelled what it held instead of letting it finish", id)
			}
			// Admitted and run once: rank 0 admitted the job once, and the
			// client's tokens are the reference's, each once.
			head := c.procs[0]
			if head == nil {
				head = pr
			}
			if k := strings.Count(head.out.String(), `"msg":"job admitted","worker":"ptest-r0","job":"`+res.JobID+`"`); k != 1 {
				t.Errorf("rank 0 admitted the job %d times", k)
			}
		})
	}
}

// TestLayoutGroupFiles: the decode group files of the layouts in configs/
// load for their models (the local one for the demo model, the cluster's
// for K3).
func TestLayoutGroupFiles(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layers int
		ranks  int
	}{{"local-group", 12, 2}, {"cluster-group", 93, 4}} {
		b, err := configs.Layout(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		file := writeFile(t, dir, tc.name+".yaml", string(b))
		writeFile(t, dir, "group.secret", "a-secret-for-the-test-0123456789\n")
		l, _, err := loadGroup(file, tc.layers)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(l.Ranks) != tc.ranks || l.Ranks[tc.ranks-1].Hi != tc.layers || l.Ranks[0].MemoryBudget == 0 {
			t.Fatalf("%s: %+v", tc.name, l)
		}
		if err := cp.CheckID(l.Group); err != nil {
			t.Fatalf("%s: group name: %v", tc.name, err)
		}
	}
}
