// Package cluster runs a whole tandem deployment in one process: a NATS
// server, embedded or an existing one by URL, a coordinator, a CPU
// prefill worker and an N-rank decode group on loopback, each on its own
// NATS connection and each reached only through the control plane, as
// separate machines would be. The demo, the tests and the benchmarks start
// it; members can be stopped and started again to exercise failures.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/metrics"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/coordinator/service"
	decodecp "github.com/tandem-inference/tandem/decode-worker/cpadapter"
	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/vision"
	prefillcp "github.com/tandem-inference/tandem/prefill-worker/cpadapter"
	"github.com/tandem-inference/tandem/prefill-worker/prefixstore"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
	"github.com/tandem-inference/tandem/tokenizer"
)

// Options configure a cluster. Zero values take the defaults named.
type Options struct {
	// ModelDir is the checkpoint every member serves.
	ModelDir string
	// NATSURL joins an existing NATS server; empty starts an embedded one,
	// which Server configures.
	NATSURL string
	Server  cp.ServerConfig
	// Identities are the deployment's NATS users as cp.NewIdentities makes
	// them, the coordinator, the workers and the client "local". Each member
	// logs in as its own, and Connect as the client. When nil, an embedded
	// server without a single user in Server gets fresh ones, and with
	// NATSURL the members log in as Server's single user, if any.
	Identities []cp.Identity
	// Coordinator configures the coordinator; its Model, Tokenizer, Queue,
	// Registry and Log are filled in.
	Coordinator service.Config
	Queue       cp.QueueConfig
	Registry    cp.RegistryConfig
	// Ranks is the decode group's size, by default 2, and Group its name,
	// by default "local".
	Ranks int
	Group string
	// Tensor is the decode group's ranks per pipeline stage (0 or 1:
	// unsplit stages); it divides Ranks.
	Tensor int
	// NoPrefill starts no prefill worker, and NoCoordinator no coordinator
	// when one runs elsewhere on NATSURL.
	NoPrefill, NoCoordinator bool
	// PrefillBudget is the prefill worker's memory budget; default 256 MiB.
	PrefillBudget int64
	// Threads is the threads per compute backend; 0 means all cores.
	Threads int
	// PrefillBackend, if set, makes the prefill worker's compute backend
	// at each start, by default the CPU backend with Threads threads. Tests
	// wrap the CPU backend to hold a pass at a layer of their choosing.
	PrefillBackend func() kernels.Backend
	// DecodeMemory is each decode rank's state budget; 0 means unlimited.
	DecodeMemory int64
	// PrefixCache configures the decode ranks' prefix-state cache, on by
	// default.
	PrefixCache pipeline.PrefixCacheConfig
	// Draft configures the decode group's speculative decoding (on, with
	// the lookup drafters, by default).
	Draft pipeline.DraftConfig
	// PrefixStore, when its Dir is set, gives the prefill worker a prefix
	// store there, of MaxBytes or by default 1 GiB, that outlives the
	// worker's restarts as a disk does.
	PrefixStore struct {
		Dir      string
		MaxBytes int64
	}
	// Heartbeat is the workers' heartbeat interval; default TTL/3.
	Heartbeat time.Duration
	// Transfer is the data plane's timeouts; zero takes kvtransfer's
	// defaults.
	Transfer kvtransfer.Timeouts
	// Mesh is the decode group's keep-alive and idle limit; zero takes the
	// defaults.
	MeshHeartbeat, MeshIdle time.Duration
	Metrics                 *metrics.Metrics
	Log                     *zap.Logger
}

// Cluster is a running deployment.
type Cluster struct {
	opt       Options
	Server    *cp.Server // nil when joining NATSURL
	URL       string
	Model     *modelinfo.Info
	Tokenizer *tokenizer.Tokenizer // nil for a model without one
	Group     *group.Group
	modelCfg  *model.Config
	log       *zap.Logger
	// tower is the checkpoint's vision tower (nil: it has none), which
	// rank 0 runs for the images of the jobs the group prefills itself;
	// images is its encoder.
	tower  *vision.Tower
	images *imagejob.Encoder

	mu          sync.Mutex
	coord       *member
	coordinator *service.Coordinator
	prefill     *prefillMember
	ranks       []*rankMember
}

type member struct {
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

type prefillMember struct {
	nc      *nats.Conn
	worker  *worker.Worker
	adapter *prefillcp.Adapter
}

type rankMember struct {
	nc      *nats.Conn
	adapter *decodecp.Adapter
}

// Start starts every member and returns once the coordinator serves and
// every worker is registered.
func Start(ctx context.Context, opt Options) (c *Cluster, err error) {
	if opt.Ranks == 0 {
		opt.Ranks = 2
	}
	if opt.Group == "" {
		opt.Group = "local"
	}
	if opt.PrefillBudget == 0 {
		opt.PrefillBudget = 256 << 20
	}
	if opt.Log == nil {
		opt.Log = zap.NewNop()
	}
	info, err := modelinfo.Load(opt.ModelDir)
	if err != nil {
		return nil, err
	}
	mc, err := model.LoadConfig(filepath.Join(opt.ModelDir, modelinfo.ConfigFile))
	if err != nil {
		return nil, err
	}
	if opt.PrefixCache.ModelID == "" {
		opt.PrefixCache.ModelID = info.ID // as the decode worker's binary seeds it
	}
	c = &Cluster{opt: opt, Model: info, modelCfg: mc, log: opt.Log, URL: opt.NATSURL}
	started := c // the returns below set c to nil
	defer func() {
		if err != nil {
			started.Close()
		}
	}()
	if _, statErr := os.Stat(filepath.Join(opt.ModelDir, tokenizer.ModelFile)); statErr == nil {
		if c.Tokenizer, err = tokenizer.Load(opt.ModelDir); err != nil {
			return nil, err
		}
	}
	c.tower, err = vision.Load(ctx, cpu.New(opt.Threads), opt.ModelDir)
	switch {
	case errors.Is(err, vision.ErrNoVisionTower):
		c.tower, err = nil, nil
	case err != nil:
		return nil, fmt.Errorf("cluster: vision tower: %w", err)
	}
	c.images = imagejob.NewEncoder(mc, c.tower, "decode group "+cmp.Or(opt.Group, "local"))
	if c.URL == "" {
		sc := opt.Server
		if sc.Logger == nil {
			sc.Logger = opt.Log
		}
		if opt.Identities == nil && sc.User == "" && sc.Token == "" && len(sc.NKeys) == 0 {
			opt.Identities = cp.NewIdentities()
			c.opt.Identities = opt.Identities
		}
		sc.Identities = opt.Identities
		if c.Server, err = cp.StartServer(ctx, sc); err != nil {
			return nil, err
		}
		c.URL = c.Server.ClientURL()
	}
	// The coordinator first: it creates the queue and the registry.
	if !opt.NoCoordinator {
		if err = c.StartCoordinator(ctx); err != nil {
			return nil, err
		}
	}
	c.Group, err = group.Start(ctx, group.Options{ModelDir: opt.ModelDir, Ranks: opt.Ranks, Group: opt.Group, Tensor: opt.Tensor,
		Threads: opt.Threads, MemoryBudget: opt.DecodeMemory, Timeouts: opt.Transfer,
		Heartbeat: opt.MeshHeartbeat, Idle: opt.MeshIdle, PrefixCache: opt.PrefixCache, Draft: opt.Draft, Log: opt.Log.Named("decode")})
	if err != nil {
		return nil, fmt.Errorf("cluster: decode group: %w", err)
	}
	c.ranks = make([]*rankMember, opt.Ranks)
	for r := range opt.Ranks {
		if err = c.StartRank(ctx, r); err != nil {
			return nil, err
		}
	}
	if !opt.NoPrefill {
		if err = c.StartPrefill(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Connect opens a connection named name to the cluster's NATS as its
// client "local".
func (c *Cluster) Connect(ctx context.Context, name string) (*nats.Conn, error) {
	return c.ConnectAs(ctx, cp.PrincipalClient, name)
}

// ConnectAs opens a connection named name to the cluster's NATS as the
// deployment's identity of principal p. A worker logs in as the identity
// named name if there is one, else the shared one, and name, its id, also
// names its reply inbox.
func (c *Cluster) ConnectAs(ctx context.Context, p cp.Principal, name string) (*nats.Conn, error) {
	o := cp.Options{URL: c.URL, Name: name, MaxReconnects: -1, ReconnectWait: 100 * time.Millisecond}
	if ids := c.opt.Identities; ids != nil {
		id := cp.Find(ids, p)
		if p == cp.PrincipalWorker {
			// The worker's own identity when it has one, else the shared one.
			id = nil
			for i := range ids {
				if ids[i].Principal == p && (ids[i].Name == name || ids[i].Name == "" && id == nil) {
					id = &ids[i]
				}
			}
		}
		if id == nil {
			return nil, fmt.Errorf("cluster: no %s identity among the cluster's identities", p)
		}
		o.Identity = id
		if p == cp.PrincipalWorker && id.Name == "" {
			o.InboxPrefix = cp.InboxPrefix(p, name)
		}
	} else {
		o.User, o.Password, o.Token = c.opt.Server.User, c.opt.Server.Password, c.opt.Server.Token
		if p == cp.PrincipalClient {
			// The coordinator answers a client only on its own inbox.
			o.InboxPrefix = cp.InboxPrefix(p, cp.DefaultClient)
		}
	}
	return cp.Connect(ctx, o)
}

// Identities are the deployment's NATS users, nil for an open server.
func (c *Cluster) Identities() []cp.Identity { return c.opt.Identities }

func (c *Cluster) registry(ctx context.Context, nc *nats.Conn) (*cp.Registry, error) {
	return cp.OpenRegistry(ctx, nc, c.opt.Registry)
}

// workerRegistry is the registry as a worker on nc opens it: with the
// deployment's identities, the bucket the coordinator set up.
func (c *Cluster) workerRegistry(ctx context.Context, nc *nats.Conn) (*cp.Registry, error) {
	return cp.WorkerRegistry(ctx, nc, c.opt.Registry, c.opt.Identities != nil, c.log)
}

// Coordinator is the running coordinator, nil while stopped.
func (c *Cluster) Coordinator() *service.Coordinator {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.coordinator
}

// StartCoordinator starts the coordinator and waits until it serves.
func (c *Cluster) StartCoordinator(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.coord != nil {
		return errors.New("cluster: the coordinator is running")
	}
	nc, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "coordinator")
	if err != nil {
		return err
	}
	cfg := c.opt.Coordinator
	cfg.Model, cfg.Tokenizer, cfg.Queue, cfg.Registry = c.Model, c.Tokenizer, c.opt.Queue, c.opt.Registry
	if cfg.Log == nil {
		cfg.Log = c.log.Named("coordinator")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = c.opt.Metrics
	}
	co, err := service.New(nc, cfg)
	if err != nil {
		nc.Close()
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m := &member{nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- co.Run(runCtx) }()
	select {
	case <-co.Ready():
	case err := <-m.done:
		cancel()
		nc.Close()
		return fmt.Errorf("cluster: coordinator: %w", err)
	case <-ctx.Done():
		cancel()
		<-m.done
		nc.Close()
		return ctx.Err()
	}
	c.coord, c.coordinator = m, co
	return nil
}

// StopCoordinator stops the coordinator cleanly and waits for it; its jobs
// go back to the queue after its grace period.
func (c *Cluster) StopCoordinator() error {
	c.mu.Lock()
	m := c.coord
	c.coord, c.coordinator = nil, nil
	c.mu.Unlock()
	if m == nil {
		return nil
	}
	m.cancel()
	err := <-m.done
	m.nc.Close()
	return err
}

// KillCoordinator stops the coordinator as a crash would: its connection
// drops and nothing is handed back, so the queue delivers its jobs again
// after the ack wait.
func (c *Cluster) KillCoordinator() {
	c.mu.Lock()
	m := c.coord
	c.coord, c.coordinator = nil, nil
	c.mu.Unlock()
	if m == nil {
		return
	}
	m.nc.Close()
	m.cancel()
	<-m.done
}

// StartPrefill starts the prefill worker and registers it.
func (c *Cluster) StartPrefill(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.prefill != nil {
		return errors.New("cluster: the prefill worker is running")
	}
	nc, err := c.ConnectAs(ctx, cp.PrincipalWorker, "prefill-0")
	if err != nil {
		return err
	}
	reg, err := c.workerRegistry(ctx, nc)
	if err != nil {
		nc.Close()
		return err
	}
	var be kernels.Backend
	if c.opt.PrefillBackend != nil {
		be = c.opt.PrefillBackend()
	}
	wc := worker.Config{Model: c.opt.ModelDir, Budget: c.opt.PrefillBudget, Depth: -1, Backend: be, Threads: c.opt.Threads,
		Log: c.log.Named("prefill")}
	if ps := c.opt.PrefixStore; ps.Dir != "" {
		st, problems, err := prefixstore.Open(prefixstore.Config{Dir: ps.Dir, MaxBytes: cmp.Or(ps.MaxBytes, 1<<30), Model: c.modelCfg,
			DType: model.BF16, Salt: prefixkey.Salt(c.Model.ID, uint8(model.BF16))})
		if err != nil {
			nc.Close()
			return err
		}
		for _, p := range problems {
			c.log.Warn("prefix store: a file failed its checks and was removed", zap.Error(p))
		}
		wc.Store = st
	}
	w, err := worker.New(wc)
	if err != nil {
		nc.Close()
		return err
	}
	a, err := prefillcp.Start(ctx, prefillcp.Config{Conn: nc, Registry: reg, WorkerID: "prefill-0", Worker: w, ModelID: c.Model.ID,
		MemoryTotal: c.opt.PrefillBudget, Heartbeat: c.opt.Heartbeat, Transfer: c.opt.Transfer, Log: c.log.Named("prefill")})
	if err != nil {
		w.Close()
		nc.Close()
		return err
	}
	c.prefill = &prefillMember{nc: nc, worker: w, adapter: a}
	return nil
}

// StopPrefill stops the prefill worker cleanly; it deregisters.
func (c *Cluster) StopPrefill(ctx context.Context) error {
	c.mu.Lock()
	p := c.prefill
	c.prefill = nil
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	err := p.adapter.Close(ctx)
	err = errors.Join(err, p.worker.Close())
	p.nc.Close()
	return err
}

// KillPrefill stops the prefill worker as a crash would: its NATS
// connection and its transfers drop mid-job, it does not deregister.
func (c *Cluster) KillPrefill() {
	c.mu.Lock()
	p := c.prefill
	c.prefill = nil
	c.mu.Unlock()
	if p == nil {
		return
	}
	p.nc.Close()
	_ = p.worker.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.adapter.Close(ctx) // its connection is gone: nothing reaches NATS
}

// PrefillWorker is the running prefill worker, nil while stopped.
func (c *Cluster) PrefillWorker() *worker.Worker {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.prefill == nil {
		return nil
	}
	return c.prefill.worker
}

// StartRank registers decode rank r, starting its worker again if it was
// killed.
func (c *Cluster) StartRank(ctx context.Context, r int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ranks[r] != nil {
		return fmt.Errorf("cluster: rank %d is running", r)
	}
	if c.Group.Worker(r) == nil {
		if err := c.Group.Restart(r); err != nil {
			return err
		}
	}
	id := c.RankID(r)
	nc, err := c.ConnectAs(ctx, cp.PrincipalWorker, id)
	if err != nil {
		return err
	}
	reg, err := c.workerRegistry(ctx, nc)
	if err != nil {
		nc.Close()
		return err
	}
	cfg := decodecp.Config{Conn: nc, Registry: reg, WorkerID: id, Worker: c.Group.Worker(r), Layout: c.Group.Layout, Rank: r,
		Model: c.modelCfg, ModelID: c.Model.ID, Heartbeat: c.opt.Heartbeat, Log: c.log.Named("decode")}
	if r == 0 {
		cfg.Tokenizer, cfg.Images = c.Tokenizer, c.images
	}
	a, err := decodecp.Start(ctx, cfg)
	if err != nil {
		nc.Close()
		return err
	}
	c.ranks[r] = &rankMember{nc: nc, adapter: a}
	return nil
}

// RankID is decode rank r's worker id.
func (c *Cluster) RankID(r int) string { return fmt.Sprintf("%s-r%d", c.opt.Group, r) }

// StopRank deregisters decode rank r cleanly. Its worker keeps running
// until StartRank registers it again, and the group takes no jobs
// meanwhile.
func (c *Cluster) StopRank(ctx context.Context, r int) error {
	c.mu.Lock()
	m := c.ranks[r]
	c.ranks[r] = nil
	c.mu.Unlock()
	if m == nil {
		return nil
	}
	err := m.adapter.Close(ctx)
	m.nc.Close()
	return err
}

// KillRank stops decode rank r as a crash would: its links and its NATS
// connection drop, it does not deregister.
func (c *Cluster) KillRank(r int) {
	c.mu.Lock()
	m := c.ranks[r]
	c.ranks[r] = nil
	c.mu.Unlock()
	if m == nil {
		return
	}
	m.nc.Close()
	c.Group.Stop(r)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = m.adapter.Close(ctx)
}

// WaitReady waits until the decode ring is formed and the registry shows
// every rank ready, after a start or a restart.
func (c *Cluster) WaitReady(ctx context.Context) error {
	if err := c.Group.Head().WaitReady(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	var ranks []*rankMember
	ranks = append(ranks, c.ranks...)
	c.mu.Unlock()
	for _, m := range ranks {
		if m != nil {
			m.adapter.Beat()
		}
	}
	nc, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "wait-ready")
	if err != nil {
		return err
	}
	defer nc.Close()
	reg, err := c.registry(ctx, nc)
	if err != nil {
		return err
	}
	for {
		ws, err := reg.List(ctx)
		ready := 0
		for _, w := range ws {
			if w.Kind == cp.KindDecode && w.GroupID == c.opt.Group && !w.Draining {
				ready++
			}
		}
		if err == nil && ready == c.opt.Ranks {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: %d of %d decode ranks ready: %w", ready, c.opt.Ranks, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops every member: the workers first, then the coordinator, then
// the server.
func (c *Cluster) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	errs = append(errs, c.StopPrefill(ctx))
	c.mu.Lock()
	ranks := c.ranks
	c.ranks = make([]*rankMember, len(ranks))
	c.mu.Unlock()
	for _, m := range ranks {
		if m != nil {
			errs = append(errs, m.adapter.Close(ctx))
			m.nc.Close()
		}
	}
	if c.Group != nil {
		errs = append(errs, c.Group.Close())
	}
	if c.tower != nil {
		c.tower.Close()
	}
	errs = append(errs, c.StopCoordinator())
	if c.Server != nil {
		errs = append(errs, c.Server.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
