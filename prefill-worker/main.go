// Command prefill-worker prefills prompts for Kimi K3 layer by layer,
// streaming each layer's weights from disk under a memory budget, batching
// every waiting prompt into one weight pass, and handing each layer's state
// to a sink as soon as the layer is done.
//
// Standalone mode (debugging, benchmarks) prefills prompts from the command
// line and writes each one's state to a file:
//
//	prefill-worker --model DIR --memory-budget 4GiB --prompt 1,2,3 --prompt 4,5 --out STATES
//	prefill-worker --model DIR --memory-budget 512MiB --prompts-file P --dry-run
//
// The worker prefills prompt[:-1] of each prompt (the decode side runs the
// last token as its first step). The control-plane mode takes the
// coordinator's jobs instead and streams each job's state to its decode
// ranks over kvtransfer (package cpadapter):
//
//	prefill-worker --model DIR --memory-budget 24GiB --nats-url nats://coordinator:4222
//
// Configuration comes from flags, TANDEM_PREFILL_WORKER_* environment
// variables and an optional --config file (package internal/config); see
// config.go or --help for every key and its default.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/internal/health"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/cpadapter"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/prefixstore"
	"github.com/tandem-inference/tandem/prefill-worker/rss"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "prefill-worker: %v\n", err)
		os.Exit(1)
	}
}

// run is the whole program; tests call it in-process. --help prints the
// help to stdout and returns nil.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := command(stdout, stderr, func(_ *cobra.Command, cfg *workerConfig) error { return serve(ctx, cfg, stdout, stderr) })
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}

// serve runs the worker with its configuration until ctx ends (control
// plane) or its prompts are done (standalone).
func serve(ctx context.Context, cfg *workerConfig, stdout, stderr io.Writer) error {
	log, err := config.NewLogger(cfg.LogLevel, cfg.LogFormat, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	wc := worker.Config{Model: cfg.Model, Budget: cfg.Budget, Depth: cfg.Depth, Threads: cfg.Threads,
		LatentDType: cfg.CacheDType, LatentNormEps: cfg.LatentEps, ReadSize: cfg.ReadSize, Readers: cfg.Readers,
		IO: cfg.IO, MaxTile: cfg.MaxTile, SinkQueue: cfg.SinkQueue, SinkTimeout: cfg.SinkTimeout,
		CloseTimeout: cfg.CloseTimeout, Log: log}
	be, kind, closeBackend, err := openBackend(cfg.Backend, cfg.Threads, cfg.CUDADevice, log)
	if err != nil {
		return err
	}
	defer closeBackend()
	wc.Backend, cfg.Backend = be, kind
	if cfg.DryRun {
		return dryRun(wc, cfg.Prompts, stdout)
	}
	if len(cfg.Prompts) == 0 && cfg.NATS.URL == "" {
		return errors.New("no prompts: give --prompt or --prompts-file for standalone mode, or --nats-url to take the coordinator's jobs")
	}
	if cfg.MemoryLimit {
		// The planner keeps live memory within the budget; the limit makes
		// the collector keep garbage within it too.
		debug.SetMemoryLimit(cfg.Budget)
	}
	if cfg.NATS.URL != "" {
		return controlPlane(ctx, cfg, wc, log)
	}
	return standalone(ctx, wc, cfg.Prompts, cfg.Out, log, stdout)
}

// controlPlane serves the coordinator's jobs until ctx ends or a
// coordinator asks the worker to drain: the worker registers in the worker
// registry and streams each job's state to its decode ranks over
// kvtransfer. It serves /metrics, /healthz and /readyz meanwhile.
//
// openStore opens the prefix store, keyed for this model and cache dtype
// (entries of another are removed); files that fail their checks are
// removed and logged.
func openStore(cfg *workerConfig, modelID string, log *zap.Logger) (*prefixstore.Store, error) {
	mc, err := model.LoadConfig(filepath.Join(cfg.Model, "config.json"))
	if err != nil {
		return nil, err
	}
	st, problems, err := prefixstore.Open(prefixstore.Config{Dir: cfg.StoreDir, MaxBytes: cfg.StoreBytes, Model: mc,
		DType: cfg.CacheDType, Salt: prefixkey.Salt(modelID, uint8(cfg.CacheDType))})
	if err != nil {
		return nil, err
	}
	for _, p := range problems {
		log.Warn("prefix store: a file failed its checks and was removed", zap.Error(p))
	}
	s := st.Stats()
	log.Info("prefix store open", zap.String("dir", cfg.StoreDir), zap.Int("entries", s.Entries), zap.Int64("bytes", s.Bytes),
		zap.Int64("invalidated", s.Invalidated), zap.Int64("bound", cfg.StoreBytes))
	return st, nil
}

// Leaving is bounded: running jobs may finish for cfg.DrainGrace (no new
// ones are taken), and what follows (cancelling the rest, deregistering,
// closing) takes at most cfg.ShutdownGrace, whether or not NATS is still
// there.
func controlPlane(ctx context.Context, cfg *workerConfig, wc worker.Config, log *zap.Logger) error {
	id := cfg.WorkerID
	if id == "" {
		host, _ := os.Hostname()
		var err error
		if id, err = controlplane.WorkerIDFrom("prefill", host); err != nil {
			return fmt.Errorf("worker id from the host name: %w (give --worker-id)", err)
		}
	}
	modelID, err := modelinfo.Identity(cfg.Model)
	if err != nil {
		return err
	}
	if cfg.StoreDir != "" {
		if wc.Store, err = openStore(cfg, modelID, log); err != nil {
			return err
		}
	}
	// The endpoint comes up first: /healthz answers while the model
	// loads, and /readyz says what is missing.
	hs := health.New(nil)
	m := cpadapter.NewMetrics(hs.Registry(), cfg.Budget)
	wc.OnLayer, wc.OnPass = m.Layer, m.Pass
	hs.Ready("worker", func() error { return errors.New("starting: opening the model and joining the control plane") })
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()
	metricsAddr, err := hs.Start(httpCtx, "metrics", cfg.Metrics, log)
	if err != nil {
		return err
	}
	w, err := worker.New(wc)
	if err != nil {
		return err
	}
	defer w.Close()
	m.Watch(w)
	o := cfg.NATS
	o.Name, o.Logger = id, log
	// The worker identity may read only worker inboxes: this one's own.
	o.InboxPrefix = controlplane.InboxPrefix(controlplane.PrincipalWorker, id)
	if f := o.UseLocalIdentity(controlplane.PrincipalWorker); f != "" {
		log.Info("control plane: this machine's worker identity", zap.String("file", f))
	}
	nc, err := controlplane.Connect(ctx, o)
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	defer nc.Close()
	hs.Ready("nats", health.NATS(nc))
	reg, err := controlplane.WorkerRegistry(ctx, nc, cfg.Registry, o.Identity != nil || o.IdentityFile != "", log)
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	a, err := cpadapter.Start(ctx, cpadapter.Config{Conn: nc, Registry: reg, WorkerID: id, Worker: w, ModelID: modelID,
		Backend: cfg.Backend, MemoryTotal: cfg.Budget, Heartbeat: cfg.Beat, Transfer: cfg.Transfer,
		TransferConns: cfg.TransferConns, Metrics: m, MetricsAddr: metricsAddr, Log: log})
	if err != nil {
		return err
	}
	hs.Ready("worker", a.NotReady)
	log.Info("control plane joined", zap.String("worker", id), zap.String("nats", nc.ConnectedUrlRedacted()))
	controlplane.Leave(ctx, a, cfg.DrainGrace, cfg.ShutdownGrace, log)
	return nil
}

// dryRun prints the plan of every pass the prompts would take, as the
// scheduler would run them, without reading weights.
func dryRun(wc worker.Config, prompts [][]int32, stdout io.Writer) error {
	info, err := worker.Inspect(wc)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "model %s: %d layers, %s of weights, largest layer %s; budget %s\n", wc.Model, info.Model.NumLayers,
		progress.HumanBytes(info.Layout.TensorBytes), progress.HumanBytes(info.Layout.SlotBytes), progress.HumanBytes(wc.Budget))
	jobs := make([]planner.Job, len(prompts))
	for i, p := range prompts {
		jobs[i] = planner.Job{ID: fmt.Sprintf("p%d", i), Total: len(p) - 1}
	}
	first, err := planner.Make(planner.Input{Costs: info.Costs, Budget: wc.Budget, Depth: wc.Depth, MaxTile: wc.MaxTile})
	if err != nil {
		return err
	}
	depth := first.Depth
	for pass := 1; ; pass++ {
		var queue []planner.Job
		for _, j := range jobs {
			if j.Done > 0 && j.Done < j.Total {
				queue = append(queue, j)
			}
		}
		for _, j := range jobs {
			if j.Done == 0 && j.Total > 0 {
				queue = append(queue, j)
			}
		}
		if len(queue) == 0 {
			return nil
		}
		p, err := planner.Make(planner.Input{Costs: info.Costs, Budget: wc.Budget, Depth: depth, MaxTile: wc.MaxTile, Jobs: queue})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pass %d: %s\n", pass, p)
		for _, r := range p.Rejected {
			jobs[index(jobs, r.ID)].Done = jobs[index(jobs, r.ID)].Total
		}
		if len(p.Pieces) == 0 {
			return nil
		}
		for _, pc := range p.Pieces {
			jobs[index(jobs, pc.ID)].Done = pc.Hi
		}
	}
}

func index(jobs []planner.Job, id string) int {
	for i, j := range jobs {
		if j.ID == id {
			return i
		}
	}
	return -1
}

// standalone prefills the prompts (all submitted at once, so they share
// passes) and writes each state to out/<job>.k3st.
func standalone(ctx context.Context, wc worker.Config, prompts [][]int32, out string, log *zap.Logger, stdout io.Writer) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var mu sync.Mutex
	var last [2]int
	wc.OnPass = func(r scheduler.PassReport) {
		s := r.Stats
		fmt.Fprintf(stdout, "pass %d: %d tokens, %d layers, %.2f GB read in %v (%.2f GB/s), compute %v, waited on reads %v\n",
			r.Pass, s.Tokens, s.Layers, float64(s.Bytes)/1e9, s.Wall.Round(time.Millisecond),
			float64(s.Bytes)/1e9/max(s.Wall.Seconds(), 1e-9), s.Compute.Round(time.Millisecond), s.ReadWait.Round(time.Millisecond))
	}
	w, err := worker.New(wc)
	if err != nil {
		return err
	}
	defer w.Close()
	// One progress line per layer of each pass, whichever job reports it.
	progressLine := func(p scheduler.Progress) {
		mu.Lock()
		defer mu.Unlock()
		if last == [2]int{p.Pass, p.Layer} {
			return
		}
		last = [2]int{p.Pass, p.Layer}
		log.Info("progress", zap.Int("pass", p.Pass), zap.String("layer", fmt.Sprintf("%d/%d", p.Layer, p.Layers)),
			zap.Float64("read_gbps", float64(int(p.ReadGBps*1000))/1000), zap.Duration("eta", p.ETA.Round(time.Millisecond)))
	}
	specs := make([]worker.Spec, len(prompts))
	paths := make([]string, len(prompts))
	for i, p := range prompts {
		id := fmt.Sprintf("p%d", i)
		paths[i] = filepath.Join(out, id+".k3st")
		f, err := sink.NewFile(paths[i], w.Model().NumLayers)
		if err != nil {
			for _, s := range specs[:i] {
				s.Sink.Abort(err)
			}
			return err
		}
		specs[i] = worker.Spec{ID: id, Tokens: p[:len(p)-1], Sink: f, Progress: progressLine}
	}
	// All at once: the prompts share passes.
	jobs, err := w.SubmitAll(specs)
	if err != nil {
		for _, s := range specs {
			s.Sink.Abort(err)
		}
		return err
	}
	var failed int
	for i, j := range jobs {
		if err := j.Wait(ctx); err != nil {
			failed++
			fmt.Fprintf(stdout, "%s: failed: %v\n", j.ID(), err)
			continue
		}
		r := j.Result()
		fmt.Fprintf(stdout, "%s: %d tokens prefilled in %d passes (waited %v, prefill %v) -> %s\n", j.ID(), r.Tokens, r.Passes,
			r.Wait.Round(time.Millisecond), r.Prefill.Round(time.Millisecond), paths[i])
	}
	st := w.Stats()
	peak := "n/a"
	if p, err := rss.Peak(); err == nil {
		peak = progress.HumanBytes(p)
	}
	fmt.Fprintf(stdout, "%d passes, %d jobs done, %d failed; %.1f tokens/s of compute; peak RSS %s of a %s budget\n",
		st.Passes, st.Completed, failed, st.PrefillTokensPerSec, peak, progress.HumanBytes(wc.Budget))
	if failed > 0 {
		return fmt.Errorf("%d of %d prompts failed", failed, len(jobs))
	}
	return nil
}
