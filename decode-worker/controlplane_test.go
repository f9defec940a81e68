package main

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
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
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestControlPlaneMode: decode-worker processes started with --nats-url
// and the worker identity (--nats-credentials) register in the worker
// registry of a server that admits only tandem's identities, rank 0 takes
// a coordinator's job and publishes its tokens (the monolithic model's) to
// the job's client, and a rank stopping deregisters.
func TestControlPlaneMode(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 0)
	ctx := testctx.Context(t)
	ids := cp.NewIdentities()
	srv, err := cp.StartServer(ctx, cp.ServerConfig{Identities: ids})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	nc, err := cp.Connect(ctx, cp.Options{URL: srv.ClientURL(), Identity: cp.Find(ids, cp.PrincipalCoordinator)})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	clientNC, err := cp.Connect(ctx, cp.Options{URL: srv.ClientURL(), Identity: cp.Find(ids, cp.PrincipalClient)})
	if err != nil {
		t.Fatal(err)
	}
	defer clientNC.Close()
	creds := filepath.Join(t.TempDir(), "worker.json")
	if err := cp.SaveIdentity(creds, cp.Find(ids, cp.PrincipalWorker)); err != nil {
		t.Fatal(err)
	}
	info, err := modelinfo.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	co, err := service.New(nc, service.Config{Model: info, Queue: cp.QueueConfig{Memory: true},
		Registry: cp.RegistryConfig{TTL: 2 * time.Second}, ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- co.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	<-co.Ready()

	c := startCluster(t, dir, 2, nil, "--nats-url", srv.ClientURL(), "--nats-credentials", creds, "--registry-ttl", "2s")
	reg, err := cp.OpenRegistry(ctx, nc, cp.RegistryConfig{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ws, _ := reg.List(ctx)
		ready := 0
		for _, w := range ws {
			if w.Kind == cp.KindDecode && w.GroupID == "ptest" && !w.Draining && w.Model == info.ID {
				ready++
			}
		}
		if ready == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the ranks did not register ready: %v", ws)
		case <-time.After(50 * time.Millisecond):
		}
	}

	// A rank registers before it subscribes (see cpadapter.New): wait for
	// rank 0's status subject, subscribed after its assign and cancel
	// subjects on the same connection, to answer.
	for {
		if _, err := nc.RequestWithContext(ctx, cp.WorkerStatus("ptest-r0"), nil); !errors.Is(err, nats.ErrNoResponders) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("rank 0 never served its subjects")
		case <-time.After(50 * time.Millisecond):
		}
	}

	// Malformed requests on rank 0's subjects are answered, not dropped.
	for _, subject := range []string{cp.WorkerAssign("ptest-r0"), cp.WorkerCancel("ptest-r0")} {
		if err := natstest.MalformedAnswered(ctx, nc, subject); err != nil {
			t.Error(err)
		}
	}

	p := makePrompt(9, ref.Cfg.VocabSize, 7)
	res, err := client.Run(ctx, clientNC, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: 6}}, client.Handlers{})
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
		ws, _ := reg.List(ctx)
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
