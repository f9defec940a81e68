// Command decode-worker is one rank of a decode group: it keeps its layer
// range's weights resident, receives remote-prefilled state for its layers
// from kvtransfer, and decodes in a pipeline with the other ranks over the
// mesh. Rank 0 takes sequences (from the control plane's adapter, or from
// clients of its front door) and hands out their tokens.
//
//	decode-worker --rank R --group-config FILE --model DIR
//
// With --nats-url the rank joins the control plane: it registers in the
// worker registry (heartbeats) and rank 0 takes the coordinator's jobs and
// publishes their tokens (package cpadapter). Without it, rank 0 serves
// clients of its front door only.
//
//	decode-worker rdma-probe [--listen ADDR | --peer ADDR]
//
// reports the machine's RDMA environment and measures an RDMA link to
// another rank (rdmaprobe.go).
//
// Configuration comes from flags, TANDEM_DECODE_WORKER_* environment
// variables and an optional --config file (package internal/config); see
// config.go or --help for every key and its default.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/decode-worker/cpadapter"
	"github.com/tandem-inference/tandem/decode-worker/frontdoor"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/internal/health"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/sysverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/tokenizer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "decode-worker: %v\n", err)
		os.Exit(1)
	}
}

// run is the whole program: it starts the rank and serves until ctx ends,
// or runs rdma-probe; --help prints the help to stdout and returns nil.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := command(stdout, stderr, func(_ *cobra.Command, cfg *workerConfig) error { return serve(ctx, cfg, stderr) })
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}

// serve runs the rank with its configuration until ctx ends.
func serve(ctx context.Context, cfg *workerConfig, stderr io.Writer) error {
	base, err := config.NewLogger(cfg.LogLevel, cfg.LogFormat, stderr)
	if err != nil {
		return err
	}
	defer base.Sync()
	log := base
	// The backend first: --backend metal where there is no Metal ends here.
	be, kind, closeBackend, err := openBackend(cfg.Backend, cfg.Threads, log)
	if err != nil {
		return err
	}
	defer closeBackend()
	cfg.Backend = kind

	mcfg, err := model.LoadConfig(filepath.Join(cfg.Model, "config.json"))
	if err != nil {
		return err
	}
	layout, secret, err := loadGroup(cfg.GroupConfig, mcfg.NumLayers)
	if err != nil {
		return err
	}
	if err := layout.CheckModel(mcfg); err != nil {
		return fmt.Errorf("group config %s: %w", cfg.GroupConfig, err)
	}
	if cfg.Rank > layout.Last() {
		return fmt.Errorf("--rank %d: group %q has ranks 0..%d", cfg.Rank, layout.Group, layout.Last())
	}
	// The pipeline and the adapter get base: they add the group and the
	// rank (the adapter its worker id) themselves.
	log = base.With(zap.String("group", layout.Group), zap.Int("rank", cfg.Rank))
	spec := layout.Ranks[cfg.Rank]
	if dm, ok := be.(kernels.DeviceMemory); ok {
		ck, err := safetensors.Open(cfg.Model)
		if err != nil {
			return err
		}
		need := residentBytes(ck, mcfg, layout, cfg.Rank)
		ck.Close()
		_, total := dm.DeviceMemory()
		if err := checkFits(need, total, cfg.Rank, spec.Lo, spec.Hi); err != nil {
			return err
		}
	}
	log.Info("loading weights", zap.String("model", cfg.Model), zap.Int("lo", spec.Lo), zap.Int("hi", spec.Hi), zap.String("backend", be.Name()))
	m, err := rank.LoadShard(cfg.Model, be, layout, cfg.Rank, cfg.LatentEps)
	if err != nil {
		return err
	}
	defer m.Close()
	if m.PinErr != nil {
		log.Warn(rank.PinRefused, zap.Error(m.PinErr))
	}
	m.State.LatentDType = cfg.CacheDType

	listen := cfg.Listen
	if listen == "" {
		listen = spec.Endpoint
	}
	to := kvtransfer.Timeouts{Handshake: cfg.Handshake, IO: cfg.IO, Idle: cfg.TransferIdle, KeepAlive: cfg.KeepAlive}
	tr, err := meshTransport(cfg, spec.Endpoint, log)
	if err != nil {
		return err
	}
	if s, ok := tr.(kvtransfer.Shared); ok {
		defer s.RDMA.Close()
	}
	srv, err := kvtransfer.Listen(kvtransfer.ServerConfig{Addr: listen, Timeouts: to, Transport: tr})
	if err != nil {
		return err
	}
	defer srv.Close()

	modelID, err := modelinfo.Identity(cfg.Model)
	if err != nil {
		return err
	}
	images, closeTower, err := rankImages(ctx, cfg, layout, mcfg, be, log)
	if err != nil {
		return err
	}
	defer closeTower()
	vocab := grammarVocabulary(cfg, layout, m.Model.Cfg.VocabSize, log)
	w, err := pipeline.Start(pipeline.Config{Rank: cfg.Rank, Layout: layout, Model: m.Model, Server: srv, Secret: secret, Vocabulary: vocab,
		Transport: tr, Timeouts: to, MemoryBudget: cfg.MemoryBudget, MicroBatches: cfg.MicroBatches, MaxBatch: cfg.MaxBatch,
		PrefillChunk: cfg.PrefillChunk, Heartbeat: cfg.Heartbeat, Idle: cfg.Idle, StepTimeout: cfg.StepTimeout,
		PrefixCache: pipeline.PrefixCacheConfig{Off: !cfg.PrefixCache, Stride: cfg.PrefixStride, ModelID: modelID},
		Draft:       pipeline.DraftConfig{Off: !cfg.Draft, KMax: cfg.DraftMax}, Log: base})
	if err != nil {
		return err
	}
	defer w.Close()
	log.Info("decode rank listening", zap.String("addr", srv.Addr()))

	// The front door serves until the rank leaves (after its drain, in
	// control-plane mode).
	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	var wg sync.WaitGroup
	if cfg.Frontdoor {
		wg.Add(1)
		go func() {
			defer wg.Done()
			frontdoor.Serve(serveCtx, srv, layout.Group, secret, w, log)
		}()
	}
	// /metrics, /healthz and /readyz: ready once the ring is formed (and,
	// in control-plane mode, the rank registered and not draining).
	hs := health.New(nil)
	metrics := cpadapter.NewMetrics(hs.Registry())
	metrics.Watch(w, srv)
	hs.Ready("ring", func() error {
		if !w.Stats().Formed {
			return errors.New("the group's ring is not formed (waiting for the other ranks)")
		}
		return nil
	})
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()
	metricsAddr, err := hs.Start(httpCtx, "metrics", cfg.Metrics, log)
	if err != nil {
		return err
	}
	if cfg.NATS.URL == "" {
		if err := w.WaitReady(ctx); err == nil {
			log.Info("decode group ready")
		}
		<-ctx.Done()
		log.Info("shutting down")
		wg.Wait()
		return nil
	}
	// Control-plane mode: the registry, and a bounded way out (drain,
	// then leave).
	hs.Ready("worker", func() error { return errors.New("starting: joining the control plane") })
	adapter, nc, err := startAdapter(ctx, cfg, layout, w, images, metrics, metricsAddr, base)
	if err != nil {
		return err
	}
	defer nc.Close()
	hs.Ready("nats", health.NATS(nc))
	hs.Ready("worker", adapter.NotReady)
	go func() {
		if err := w.WaitReady(ctx); err == nil {
			log.Info("decode group ready")
			adapter.Beat() // the coordinator learns at once that the ring is formed
		}
	}()
	controlplane.Leave(ctx, adapter, cfg.DrainGrace, cfg.ShutdownGrace, log)
	stopServing()
	wg.Wait()
	return nil
}

// grammarVocabulary is the vocabulary the last stage's ranks draw grammar-constrained
// tokens with: the model directory's tokenizer's, or nil (with a warning
// when the tokenizer is there but unusable; jobs with a grammar are then
// refused).
func grammarVocabulary(cfg *workerConfig, layout *rank.Layout, vocabSize int, log *zap.Logger) *grammar.Vocabulary {
	if !layout.HoldsHead(cfg.Rank) {
		return nil
	}
	if _, err := os.Stat(filepath.Join(cfg.Model, tokenizer.ModelFile)); err != nil {
		return nil
	}
	tok, err := tokenizer.Load(cfg.Model)
	if err == nil && tok.VocabSize() != vocabSize {
		err = fmt.Errorf("the tokenizer has %d ids, the model %d", tok.VocabSize(), vocabSize)
	}
	var v *grammar.Vocabulary
	if err == nil {
		v, err = tok.GrammarVocabulary()
	}
	if err != nil {
		log.Warn("no grammar-constrained decoding on this rank", zap.Error(err))
		return nil
	}
	return v
}

// startAdapter joins the control plane: the rank registers in the worker
// registry and, on rank 0, takes the coordinator's jobs.
func startAdapter(ctx context.Context, cfg *workerConfig, layout *rank.Layout, w *pipeline.Worker, images *imagejob.Encoder, m *cpadapter.Metrics, metricsAddr string,
	log *zap.Logger) (*cpadapter.Adapter, *nats.Conn, error) {
	id := cfg.WorkerID
	if id == "" {
		id = fmt.Sprintf("%s-r%d", layout.Group, cfg.Rank)
	}
	mcfg, err := model.LoadConfig(filepath.Join(cfg.Model, "config.json"))
	if err != nil {
		return nil, nil, err
	}
	modelID, err := modelinfo.Identity(cfg.Model)
	if err != nil {
		return nil, nil, err
	}
	var tok *tokenizer.Tokenizer
	if _, err := os.Stat(filepath.Join(cfg.Model, tokenizer.ModelFile)); err == nil && cfg.Rank == 0 {
		if tok, err = tokenizer.Load(cfg.Model); err != nil {
			return nil, nil, err
		}
	}
	o := cfg.NATS
	o.Name, o.Logger = id, log
	// The worker identity may read only worker inboxes: this one's own.
	o.InboxPrefix = controlplane.InboxPrefix(controlplane.PrincipalWorker, id)
	if f := o.UseLocalIdentity(controlplane.PrincipalWorker); f != "" {
		log.Info("control plane: this machine's worker identity", zap.String("file", f))
	}
	nc, err := controlplane.Connect(ctx, o)
	if err != nil {
		return nil, nil, fmt.Errorf("control plane: %w", err)
	}
	reg, err := controlplane.WorkerRegistry(ctx, nc, cfg.Registry, o.Identity != nil || o.IdentityFile != "", log)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("control plane: %w", err)
	}
	a, err := cpadapter.Start(ctx, cpadapter.Config{Conn: nc, Registry: reg, WorkerID: id, Worker: w, Layout: layout, Rank: cfg.Rank,
		Model: mcfg, ModelID: modelID, LatentDType: cfg.CacheDType, Tokenizer: tok, Images: images, Advertise: cfg.Advertise,
		Backend: cfg.Backend, Heartbeat: cfg.Beat, Metrics: m, MetricsAddr: metricsAddr, Log: log})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	log.Info("control plane joined", zap.String("worker", id), zap.String("nats", nc.ConnectedUrlRedacted()))
	return a, nc, nil
}

// meshTransport is the transport of the rank's mesh links (cfg.Transport):
// over RDMA, the device is chosen by the rank's endpoint address.
func meshTransport(cfg *workerConfig, endpoint string, log *zap.Logger) (kvtransfer.Transport, error) {
	if cfg.Transport == "tcp" {
		return &kvtransfer.TCP{}, nil
	}
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		ips, err := net.LookupIP(host)
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("endpoint %q: no address for its host: %v", endpoint, err)
		}
		ip = ips[0]
	}
	rc := cfg.RDMA
	rc.Logger = log
	// The system's verbs library; a missing one is an RDMA failure like
	// any other (auto falls back to TCP).
	if rc.Provider == nil {
		p, err := sysverbs.System()
		if err != nil {
			p = verbs.Unavailable(err)
		}
		rc.Provider = p
	}
	return kvtransfer.ChooseTransport(cfg.Transport, rc, ip, log)
}
