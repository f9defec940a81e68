package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/coordinator/service"
	decodecp "github.com/tandem-inference/tandem/decode-worker/cpadapter"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/kvtransfer/faultproxy"
	"github.com/tandem-inference/tandem/model"
	prefillcp "github.com/tandem-inference/tandem/prefill-worker/cpadapter"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// deployOptions describe the system bench e2e starts.
type deployOptions struct {
	ModelDir string
	Ranks    int
	Threads  int
	// PrefillBudget is the prefill worker's memory budget (bytes).
	PrefillBudget int64
	// LinkRate, when positive, limits each decode rank's kvtransfer
	// traffic from the prefill worker to this many bytes per second.
	LinkRate int64
	// Rates seed the coordinator's cost model.
	Rates router.Rates
	// Draft configures the decode group's speculative decoding, and
	// PrefixCache its prefix-state cache.
	Draft       pipeline.DraftConfig
	PrefixCache pipeline.PrefixCacheConfig
	Log         *zap.Logger
}

// benchMeshIdle is how long a decode rank's link may stay silent before
// the rank takes its peer for dead (see startDeployment).
const benchMeshIdle = 30 * time.Second

// prefillID is the prefill worker's id in the registry.
const prefillID = "prefill-0"

// deployment is the whole system on this machine: an in-process cluster
// (embedded NATS with JetStream on disk, the coordinator, the decode group)
// with the bench's own prefill worker, so that it sees every weight pass
// (coordinator/cluster does not expose the worker's pass hook), and with
// LinkRate a rate-limiting proxy in front of each rank's kvtransfer server,
// advertised in the registry in its place (cluster has no hook for that
// either: the ranks are registered again by the bench).
type deployment struct {
	opt      deployOptions
	c        *cluster.Cluster
	registry cp.RegistryConfig

	pnc     *nats.Conn
	pworker *worker.Worker
	padapt  *prefillcp.Adapter

	ranks   []*decodecp.Adapter
	rankNCs []*nats.Conn
	proxies []*faultproxy.Proxy

	mu     sync.Mutex
	passes []passRecord
}

// passRecord is one weight pass as the prefill worker reported it.
type passRecord struct {
	End time.Time
	Rep scheduler.PassReport
}

func startDeployment(ctx context.Context, opt deployOptions) (d *deployment, err error) {
	if opt.Log == nil {
		opt.Log = zap.NewNop()
	}
	d = &deployment{opt: opt, registry: cp.RegistryConfig{Memory: true, TTL: 3 * time.Second}}
	// The bench measures speed on a shared machine, not how fast a dead
	// rank is noticed: a decode rank starved of the cores for the mesh's
	// default 3 s (a warm-up job failed so at load average 10 on 2 cores)
	// would fail the whole run.
	d.c, err = cluster.Start(ctx, cluster.Options{ModelDir: opt.ModelDir, Ranks: opt.Ranks, Threads: opt.Threads,
		NoPrefill: true, Registry: d.registry, Log: opt.Log, MeshIdle: benchMeshIdle, Draft: opt.Draft, PrefixCache: opt.PrefixCache,
		Coordinator: service.Config{Rates: opt.Rates}})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if opt.LinkRate > 0 {
		if err := d.limitLinks(ctx); err != nil {
			return nil, err
		}
	}
	if err := d.startPrefill(ctx); err != nil {
		return nil, err
	}
	if err := d.c.WaitReady(ctx); err != nil {
		return nil, err
	}
	return d, d.waitPrefill(ctx)
}

// startPrefill starts the prefill worker as cluster.StartPrefill does,
// with the pass hook.
func (d *deployment) startPrefill(ctx context.Context) error {
	nc, err := d.c.ConnectAs(ctx, cp.PrincipalWorker, prefillID)
	if err != nil {
		return err
	}
	d.pnc = nc
	reg, err := cp.WorkerRegistry(ctx, nc, d.registry, d.c.Identities() != nil, nil)
	if err != nil {
		return err
	}
	d.pworker, err = worker.New(worker.Config{Model: d.opt.ModelDir, Budget: d.opt.PrefillBudget, Depth: -1, Threads: d.opt.Threads,
		Log: d.opt.Log.Named("prefill"), OnPass: d.onPass})
	if err != nil {
		return fmt.Errorf("prefill worker: %w", err)
	}
	d.padapt, err = prefillcp.Start(ctx, prefillcp.Config{Conn: nc, Registry: reg, WorkerID: prefillID, Worker: d.pworker,
		ModelID: d.c.Model.ID, MemoryTotal: d.opt.PrefillBudget, Log: d.opt.Log.Named("prefill")})
	return err
}

// waitPrefill waits until the registry shows the prefill worker.
func (d *deployment) waitPrefill(ctx context.Context) error {
	// Reading the registry is the coordinator's right, not a worker's.
	nc, err := d.c.ConnectAs(ctx, cp.PrincipalCoordinator, "e2e-wait-prefill")
	if err != nil {
		return err
	}
	defer nc.Close()
	reg, err := cp.OpenRegistry(ctx, nc, d.registry)
	if err != nil {
		return err
	}
	for {
		ws, err := reg.List(ctx)
		if err == nil {
			for _, w := range ws {
				if w.ID == prefillID && w.Kind == cp.KindPrefill {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("e2e: the prefill worker did not show in the registry: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// limitLinks puts a rate-limited proxy in front of every rank's kvtransfer
// server and registers each rank again with the proxy as its transfer
// endpoint, so that the prefill worker's state goes through it.
func (d *deployment) limitLinks(ctx context.Context) error {
	mc, err := model.LoadConfig(filepath.Join(d.opt.ModelDir, "config.json"))
	if err != nil {
		return err
	}
	layout := d.c.Group.Layout
	for r := range layout.Ranks {
		if err := d.c.StopRank(ctx, r); err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		px, err := faultproxy.Start(faultproxy.Config{Target: layout.Ranks[r].Endpoint, Faults: faultproxy.Faults{Rate: d.opt.LinkRate}})
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		d.proxies = append(d.proxies, px)
		id := d.c.RankID(r)
		nc, err := d.c.ConnectAs(ctx, cp.PrincipalWorker, id)
		if err != nil {
			return err
		}
		d.rankNCs = append(d.rankNCs, nc)
		reg, err := cp.WorkerRegistry(ctx, nc, d.registry, d.c.Identities() != nil, nil)
		if err != nil {
			return err
		}
		cfg := decodecp.Config{Conn: nc, Registry: reg, WorkerID: id, Worker: d.c.Group.Worker(r), Layout: layout, Rank: r,
			Model: mc, ModelID: d.c.Model.ID, Advertise: px.Addr(), Log: d.opt.Log.Named("decode")}
		if r == 0 {
			cfg.Tokenizer = d.c.Tokenizer
		}
		a, err := decodecp.Start(ctx, cfg)
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		d.ranks = append(d.ranks, a)
	}
	return nil
}

func (d *deployment) onPass(rep scheduler.PassReport) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.passes = append(d.passes, passRecord{End: time.Now(), Rep: rep})
}

// takePasses returns the passes reported since the last call.
func (d *deployment) takePasses() []passRecord {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.passes
	d.passes = nil
	return p
}

// resetRouter starts the coordinator again, so that its cost model starts
// from the seed rates (as the simulator's does) and not from what earlier
// jobs measured.
func (d *deployment) resetRouter(ctx context.Context) error {
	if err := d.c.StopCoordinator(); err != nil {
		return fmt.Errorf("e2e: stopping the coordinator: %w", err)
	}
	if err := d.c.StartCoordinator(ctx); err != nil {
		return err
	}
	return d.c.WaitReady(ctx)
}

// setCache empties every decode rank's prefix cache, so that a replay
// starts cold (the workload's prompts are the same in every replay), and
// switches the group's use of it on or off.
func (d *deployment) setCache(ctx context.Context, on bool) error {
	g := d.c.Group
	for r := range g.Layout.Ranks {
		if _, err := g.Worker(r).DropCache(ctx, 0); err != nil {
			return fmt.Errorf("e2e: emptying rank %d's prefix cache: %w", r, err)
		}
	}
	return g.Head().SetPrefixCache(ctx, on)
}

// Close stops everything the bench started, then the cluster.
func (d *deployment) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, a := range d.ranks {
		errs = append(errs, a.Close(ctx))
	}
	for _, nc := range d.rankNCs {
		nc.Close()
	}
	if d.padapt != nil {
		errs = append(errs, d.padapt.Close(ctx))
	}
	if d.pworker != nil {
		errs = append(errs, d.pworker.Close())
	}
	if d.pnc != nil {
		d.pnc.Close()
	}
	if d.c != nil {
		errs = append(errs, d.c.Close())
	}
	for _, p := range d.proxies {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
