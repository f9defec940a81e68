package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/internal/health/healthtest"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/syncbuf"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// childEnv makes the test binary run as a prefill-worker process: the
// tests re-execute themselves instead of building the binary.
const childEnv = "TANDEM_PREFILL_WORKER_CHILD"

func TestMain(m *testing.M) {
	testkit.Child(childEnv, func(ctx context.Context, args []string) int {
		if err := run(ctx, args, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "prefill-worker: %v\n", err)
			return 1
		}
		return 0
	})
	testkit.Main(m)
}

// child is a prefill-worker process.
type child struct {
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	done chan struct{}
	err  error // the exit, once done is closed
}

func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1", "TANDEM_PREFILL_WORKER_MEMORY_LIMIT=false")
	c := &child{cmd: cmd, log: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("prefill-worker log:\n%s", c.log.String())
		}
	})
	return c
}

// metricsURL waits for the process to log where it serves /metrics.
func (c *child) metricsURL(t *testing.T) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		for _, line := range strings.Split(c.log.String(), "\n") {
			var l struct {
				Msg, URL string
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "metrics and health" {
				return strings.TrimSuffix(l.URL, "/metrics")
			}
		}
		select {
		case <-c.done:
			t.Fatalf("the worker exited: %v", c.err)
		case <-deadline:
			t.Fatal("the worker logged no metrics address in 60s")
		case <-time.After(20 * time.Millisecond): // polling its log for the line
		}
	}
}

// waitReadyz polls /readyz until its status is want (and, for a 503, its
// text has contains).
func (c *child) waitReadyz(t *testing.T, base string, want int, contains string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		code, body := testkit.Get(t, base+"/readyz")
		if code == want && strings.Contains(body, contains) {
			return
		}
		select {
		case <-c.done:
			t.Fatalf("the worker exited: %v", c.err)
		case <-deadline:
			t.Fatalf("/readyz: %d %q, want %d with %q", code, body, want, contains)
		case <-time.After(20 * time.Millisecond): // polling the endpoint
		}
	}
}

// TestShutdownAfterNATSDies kills the NATS server under a registered
// prefill worker, then sends the worker SIGTERM: it exits at once instead
// of waiting out its shutdown grace on a deregistration nobody can answer
// (it hung ~30 s there), within its graces as a bound, awaited on its exit.
func TestShutdownAfterNATSDies(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	srv := natstest.StartProcess(t, natstest.Config{})
	const drainGrace, shutdownGrace = 2 * time.Second, 5 * time.Second
	w := startChild(t, "--model", dir, "--memory-budget", "128MiB", "--nats-url", srv.URL, "--worker-id", "prefill-shutdown",
		"--registry-ttl", "2s", "--log-format", "json", "--metrics-listen", "127.0.0.1:0",
		"--drain-grace", drainGrace.String(), "--shutdown-grace", shutdownGrace.String())
	base := w.metricsURL(t)
	if code, body := testkit.Get(t, base+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	w.waitReadyz(t, base, http.StatusOK, "ready")

	srv.Kill()
	// The worker has seen the loss: it is no longer ready, and says why.
	w.waitReadyz(t, base, http.StatusServiceUnavailable, "nats: NATS connection")

	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
	case <-time.After(drainGrace + shutdownGrace):
		t.Fatalf("the worker did not exit within its graces (%v + %v) after SIGTERM with NATS gone", drainGrace, shutdownGrace)
	}
	if w.err != nil {
		t.Fatalf("exit: %v", w.err)
	}
	// It left at once: the deregistration was skipped for want of a
	// connection, not cut short by the grace.
	log := w.log.String()
	if !strings.Contains(log, "not connected") || strings.Contains(log, "deadline exceeded") {
		t.Fatalf("the worker did not skip its deregistration for want of a connection:\n%s", log)
	}
}

// TestMetricsAndDrain runs the prefill worker as a process of its own next
// to a coordinator and a decode group, scrapes its /metrics before and
// after a remote job (the values move as the job says they should, and
// every prefill metric the Grafana dashboard queries is exported), then
// asks it to drain (as `coordinator drain` does) while a second remote job
// is in flight: the worker takes no new jobs (the registry says draining,
// /readyz says why), the job completes exactly once with the reference
// model's tokens, and the worker exits by itself.
func TestMetricsAndDrain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, c, _ := decodeCluster(ctx, t)
	creds := filepath.Join(t.TempDir(), "worker.json")
	if err := cp.SaveIdentity(creds, cp.Find(c.Identities(), cp.PrincipalWorker)); err != nil {
		t.Fatal(err)
	}
	const id = "prefill-proc"
	const budget = 128 << 20
	w := startChild(t, "--model", dir, "--memory-budget", "128MiB", "--threads", "1", "--nats-url", c.URL, "--nats-credentials", creds,
		"--worker-id", id, "--registry-ttl", "2s", "--log-format", "json", "--metrics-listen", "127.0.0.1:0",
		"--drain-grace", "2m", "--shutdown-grace", "10s")
	base := w.metricsURL(t)
	w.waitReadyz(t, base, http.StatusOK, "ready")

	before, err := healthtest.Scrape(base)
	if err != nil {
		t.Fatal(err)
	}
	if got := before.Value("tandem_prefill_memory_budget_bytes"); got != budget {
		t.Errorf("tandem_prefill_memory_budget_bytes %v, want %d", got, budget)
	}
	if got := before.Value("tandem_prefill_passes_total"); got != 0 {
		t.Errorf("%v passes before any job", got)
	}

	nc, err := c.Connect(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	m, err := model.Load(dir, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	job := func(n, seed int, h client.Handlers) (*client.Result, []int32) {
		t.Helper()
		p := make([]int32, n)
		for i := range p {
			p[i] = int32((i*7919 + seed) % c.Model.VocabSize)
		}
		want, err := m.Generate(ctx, p, 4)
		if err != nil {
			t.Fatal(err)
		}
		res, err := client.Run(ctx, nc, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: 4}, Policy: cp.PolicyRemote}, h)
		if err != nil {
			t.Fatal(err)
		}
		return res, want
	}
	res, want := job(60, 13, client.Handlers{})
	if res.Final.State != cp.StateDone || res.Final.Route.PrefillWorker != id || !slices.Equal(res.Tokens, want) {
		t.Fatalf("job %+v: tokens %v, want %v", res.Final, res.Tokens, want)
	}
	// The worker counts the job once its transfer is acknowledged, which
	// the client need not have waited for.
	after, err := healthtest.ScrapeWhen(testctx.Context(t), base, func(f healthtest.Families) bool {
		return f.Value("tandem_prefill_jobs_total", "state", "done") == 1
	})
	if err != nil {
		t.Fatal(err)
	}
	layers := float64(c.Model.NumLayers)
	for _, x := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tandem_prefill_passes_total", nil, 1},
		{"tandem_prefill_tokens_total", nil, 59}, // the prompt less its last token
		{"tandem_prefill_jobs_total", []string{"state", "done"}, 1},
		{"tandem_prefill_assignments_total", []string{"outcome", "accepted"}, 1},
		{"tandem_prefill_layer_seconds", nil, layers}, // one observation a layer
		{"tandem_prefill_pass_seconds", nil, 1},
	} {
		if got := after.Value(x.name, x.labels...); got != x.want {
			t.Errorf("%s%v: %v after one job, want %v", x.name, x.labels, got, x.want)
		}
	}
	for _, name := range []string{"tandem_prefill_transfer_bytes_total", "tandem_prefill_weight_read_bytes_total"} {
		if after.Value(name) <= 0 {
			t.Errorf("%s did not move: %v", name, after.Value(name))
		}
	}
	if after.Value("tandem_prefill_pass_memory_bytes", "part", "states") <= 0 {
		t.Error("the pass's state memory is not reported")
	}
	if got := after.Value("tandem_prefill_time_seconds_total", "part", "compute"); got <= 0 {
		t.Errorf("compute time %v", got)
	}
	missing, err := after.DashboardsMissing("tandem_prefill_", "go_", "process_")
	if err != nil || len(missing) > 0 {
		t.Errorf("dashboard metrics the prefill worker does not export: %v %v", missing, err)
	}

	// Drain with a job in flight: asked as soon as the job is prefilling.
	coord, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "test-drain")
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	drained := make(chan *cp.DrainReply, 1)
	var asked bool
	res, want = job(1500, 29, client.Handlers{Event: func(ev cp.JobEvent) {
		if ev.State != cp.StatePrefilling || asked {
			return
		}
		asked = true
		rep, err := cp.Drain(ctx, coord, id, "test")
		if err != nil {
			t.Errorf("drain: %v", err)
		}
		drained <- rep
	}})
	if res.Final.State != cp.StateDone || res.Final.Route.PrefillWorker != id || !slices.Equal(res.Tokens, want) {
		t.Fatalf("the job in flight during the drain: %+v: tokens %v, want %v", res.Final, res.Tokens, want)
	}
	rep := <-drained
	if rep == nil || rep.WorkerID != id || rep.Running != 1 {
		t.Fatalf("drain reply %+v: want the job running", rep)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		t.Fatal("the drained worker did not exit")
	}
	if w.err != nil {
		t.Fatalf("the drained worker's exit: %v", w.err)
	}
	// Exactly once: the decode group admitted and finished each job once,
	// and the worker prefilled the drained job once.
	if hs := c.Group.Head().Stats(); hs.Admitted != 2 || hs.Finished != 2 || hs.Failed != 0 {
		t.Errorf("decode group: %d admitted, %d finished, %d failed; want both jobs once", hs.Admitted, hs.Finished, hs.Failed)
	}
	if n := strings.Count(w.log.String(), `"msg":"job prefilled and transferred","worker":"`+id+`","job":"`+res.JobID+`"`); n != 1 {
		t.Errorf("the drained job was prefilled %d times", n)
	}
	log := w.log.String()
	for _, want := range []string{"drain requested: draining, then exiting", "draining: no new jobs"} {
		if !strings.Contains(log, want) {
			t.Errorf("the worker's log lacks %q", want)
		}
	}
}

// TestShutdownOrders: a registered prefill worker on a nats-server of its
// own is sent SIGTERM after its coordinator stopped, and with its
// coordinator still running: either way it exits 0 within its graces,
// saying it shuts down, having deregistered (the registry sees its key
// deleted, not expired) without cancelling anything.
func TestShutdownOrders(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	info, err := modelinfo.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, coordinatorFirst := range []bool{true, false} {
		name := "coordinator-running"
		if coordinatorFirst {
			name = "coordinator-gone-first"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testctx.Context(t)
			srv := natstest.StartProcess(t, natstest.Config{})
			nc, err := cp.Connect(ctx, cp.Options{URL: srv.URL, Name: "coordinator"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			rc := cp.RegistryConfig{TTL: 2 * time.Second}
			co, err := service.New(nc, service.Config{Model: info, Queue: cp.QueueConfig{Memory: true}, Registry: rc, ShutdownGrace: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- co.Run(runCtx) }()
			t.Cleanup(stop)
			<-co.Ready()
			reg, err := cp.OpenRegistry(ctx, nc, rc)
			if err != nil {
				t.Fatal(err)
			}
			changes, err := reg.Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}

			const id = "prefill-orders"
			const drainGrace, shutdownGrace = 2 * time.Second, 5 * time.Second
			w := startChild(t, "--model", dir, "--memory-budget", "128MiB", "--nats-url", srv.URL, "--worker-id", id,
				"--registry-ttl", "2s", "--log-format", "json", "--metrics-listen", "127.0.0.1:0",
				"--drain-grace", drainGrace.String(), "--shutdown-grace", shutdownGrace.String())
			w.waitReadyz(t, w.metricsURL(t), http.StatusOK, "ready")
			if coordinatorFirst {
				stop()
				if err := <-ran; err != nil {
					t.Fatalf("the coordinator: %v", err)
				}
			}

			if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-w.done:
			case <-time.After(drainGrace + shutdownGrace):
				t.Fatalf("the worker did not exit within its graces (%v + %v) after SIGTERM", drainGrace, shutdownGrace)
			}
			if w.err != nil {
				t.Fatalf("exit: %v", w.err)
			}
			for left := false; !left; {
				select {
				case ch := <-changes:
					if ch.ID != id {
						continue
					}
					switch ch.Op {
					case cp.WorkerUp:
					case cp.WorkerLeft:
						left = true
					default:
						t.Fatalf("registry change %s, want the worker to deregister", ch.Op)
					}
				case <-ctx.Done():
					t.Fatal("the worker did not leave the registry")
				}
			}
			log := w.log.String()
			for _, line := range []string{`"msg":"shutting down: draining"`, `"msg":"left the control plane: deregistered"`} {
				if !strings.Contains(log, line) {
					t.Errorf("the worker's log lacks %s:\n%s", line, log)
				}
			}
			for _, bad := range []string{"drain grace over", "control plane: leaving"} {
				if strings.Contains(log, bad) {
					t.Errorf("the worker's log has %q:\n%s", bad, log)
				}
			}
		})
	}
}
