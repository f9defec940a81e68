package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// TestControlPlaneMode runs the binary's main path with --nats-url next to
// a coordinator and a decode group whose NATS admits only tandem's
// identities: the worker finds its identity in this machine's credentials
// directory without a flag, registers, takes a remote
// job, streams its state to the decode ranks (whose tokens are the
// monolithic model's), and deregisters when stopped.
func TestControlPlaneMode(t *testing.T) {
	t.Setenv("TANDEM_PREFILL_WORKER_MEMORY_LIMIT", "false")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir, c, reg := decodeCluster(ctx, t)

	// The worker logs in with the deployment's worker identity, which it
	// finds without a flag in this machine's credentials directory (here
	// a private one).
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("AppData", filepath.Join(home, "AppData"))
	credsDir, err := cp.DefaultCredentialsDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(credsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := cp.SaveIdentity(cp.IdentityFile(credsDir, cp.PrincipalWorker), cp.Find(c.Identities(), cp.PrincipalWorker)); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"--model", dir, "--memory-budget", "128MiB", "--nats-url", c.URL, "--worker-id", "prefill-test",
			"--registry-ttl", "2s", "--log-level", "warn"}, &stdout, &stderr)
	}()
	nc, err := c.Connect(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The registry is the coordinator's to read.
	coord, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "test-registry")
	if err != nil {
		t.Fatal(err)
	}
	defer coord.Close()
	registry, err := cp.OpenRegistry(ctx, coord, reg)
	if err != nil {
		t.Fatal(err)
	}
	// Watched, not polled: the requests below go out the moment the
	// registry shows the worker, which must find it serving.
	changes, err := registry.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for registered := false; !registered; {
		select {
		case ch := <-changes:
			registered = ch.Op == cp.WorkerUp && ch.ID == "prefill-test" && ch.Info.Kind == cp.KindPrefill && ch.Info.Model == c.Model.ID
		case err := <-done:
			t.Fatalf("the worker stopped: %v\n%s", err, stderr.String())
		case <-ctx.Done():
			t.Fatal("the worker did not register")
		}
	}

	// Malformed requests on the worker's own subjects (which only the
	// coordinator may send to) are answered, not dropped: the sender
	// learns at once what was wrong.
	for _, subject := range []string{cp.WorkerAssign("prefill-test"), cp.WorkerCancel("prefill-test")} {
		if err := natstest.MalformedAnswered(ctx, coord, subject); err != nil {
			t.Error(err)
		}
	}

	p := make([]int32, 60)
	for i := range p {
		p[i] = int32((i*7919 + 13) % c.Model.VocabSize)
	}
	res, err := client.Run(ctx, nc, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: 5}, Policy: cp.PolicyRemote}, client.Handlers{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want, err := m.Generate(ctx, p, 5)
	if err != nil {
		t.Fatal(err)
	}
	if res.Final.State != cp.StateDone || res.Final.Route.PrefillWorker != "prefill-test" || !slices.Equal(res.Tokens, want) {
		t.Fatalf("job %+v: tokens %v, want %v\n%s", res.Final, res.Tokens, want, stderr.String())
	}

	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	if _, err := registry.Get(ctx, "prefill-test"); err == nil {
		t.Fatal("the stopped worker is still registered")
	}
}

// decodeCluster starts a coordinator and a decode group on a tiny
// checkpoint, without a prefill worker (the test brings its own), and
// waits until they serve; the registry entries live 2 s.
func decodeCluster(ctx context.Context, t *testing.T) (dir string, c *cluster.Cluster, reg cp.RegistryConfig) {
	t.Helper()
	dir = testmodel.Dir(t, "tiny", 1, 2)
	reg = cp.RegistryConfig{TTL: 2 * time.Second}
	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, NoPrefill: true, Threads: 1, Registry: reg,
		Queue: cp.QueueConfig{Memory: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return dir, c, reg
}
