// Package worker is the prefill worker as a library: it opens a checkpoint,
// sizes the weight streamer's ring from the memory budget, and serves
// prefill jobs in batched layer-streamed passes. A control-plane adapter
// (NATS assignments, kvtransfer sinks) and the standalone binary both drive
// it through Submit, Cancel, Stats and Close.
//
// Memory: the planner keeps the ring, states, activations and layer
// temporaries within Config.Budget. The Go runtime bounds garbage only if
// told: processes that run a worker should call debug.SetMemoryLimit with
// the budget (the binary and bench do), so that collection keeps the heap
// within it.
package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/prefill-worker/executor"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/prefixstore"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

// Config configures a worker. Zero values take the documented defaults.
type Config struct {
	// Model is the checkpoint directory of config.json and safetensors
	// shards.
	Model string
	// Budget bounds the worker's memory, in bytes.
	Budget int64
	// Depth is the prefetch depth, the layers read ahead of compute, or -1
	// to let the planner choose from the budget.
	Depth int
	// Backend runs the layers; nil means the CPU backend with Threads
	// threads, where 0 means all cores.
	Backend kernels.Backend
	Threads int
	// LatentDType is the MLA cache dtype, by default BF16, the state
	// contract's;
	// LatentNormEps overrides the config's MLA latent norm eps when > 0.
	LatentDType   model.DType
	LatentNormEps float64
	// ReadSize, Readers and IO are the weight streamer's request size,
	// requests in flight and I/O mode.
	ReadSize int64
	Readers  int
	IO       streamer.IOMode
	// MaxTile caps the rows of one layer call; 0 takes the planner's
	// default.
	MaxTile int
	// SinkQueue, SinkTimeout and CloseTimeout are the sink queue's depth
	// and timeouts, as in scheduler.Config.
	SinkQueue                 int
	SinkTimeout, CloseTimeout time.Duration
	Log                       *zap.Logger
	// Store, when set, is the worker's prefix store, opened by
	// prefixstore.Open for this model and LatentDType. Jobs resume from the
	// longest stored prefix of their tokens and leave their state there.
	Store *prefixstore.Store
	// OnPass, if set, is called after every pass, and OnLayer after every
	// layer of a pass, from the pass's goroutine; they must be quick.
	OnPass  func(scheduler.PassReport)
	OnLayer func(executor.Progress)
}

// Worker serves prefill jobs.
type Worker struct {
	cfg    Config
	exec   *executor.Executor
	model  *model.Config
	stream *streamer.Streamer
	sched  *scheduler.Scheduler
	costs  planner.Costs
	depth  int
	cancel context.CancelFunc
	done   chan error
	tower  *residentTower // nil: the checkpoint has no vision tower
	images *imagejob.Encoder

	// The cost model's measured inputs: compute terms fitted to finished
	// passes, and the weights' read rate (bytes over the time reads were
	// in flight, over every pass so far).
	cost     *costmodel.Model
	fit      *costmodel.Fitter
	readMu   sync.Mutex
	read     int64
	readBusy time.Duration
}

// Info is what a worker knows of its model before it allocates anything:
// enough to plan passes (--dry-run).
type Info struct {
	Model  *model.Config
	Layout *streamer.Layout
	Embed  *executor.Embedder
	Costs  planner.Costs
}

// Inspect reads the checkpoint's config and headers and derives the memory
// model, without reading weights or allocating the ring.
func Inspect(cfg Config) (*Info, error) {
	cfg, be, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	mc, ck, err := model.OpenCheckpoint(cfg.Model)
	if err != nil {
		return nil, err
	}
	if cfg.LatentNormEps > 0 {
		mc.LatentNormEps = cfg.LatentNormEps
	}
	// The headers are all the worker needs from the open checkpoint; the
	// streamer opens shards per pass.
	defer ck.Close()
	lay, err := streamer.NewLayout(ck, mc.NumLayers, streamer.DefaultAlign)
	if err != nil {
		return nil, err
	}
	emb, err := executor.NewEmbedder(ck, mc)
	if err != nil {
		return nil, err
	}
	costs := planner.ModelCosts(mc, cfg.LatentDType, lay.SlotBytes, int64(emb.RowBytes), be.Threads())
	return &Info{Model: mc, Layout: lay, Embed: emb, Costs: costs}, nil
}

// withDefaults fills in defaults and checks the config.
func (cfg Config) withDefaults() (Config, kernels.Backend, error) {
	if cfg.Model == "" {
		return cfg, nil, errors.New("worker: no model directory")
	}
	if cfg.Budget <= 0 {
		return cfg, nil, fmt.Errorf("worker: memory budget %d bytes", cfg.Budget)
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.LatentDType == 0 {
		cfg.LatentDType = model.BF16
	}
	if cfg.LatentDType != model.BF16 && cfg.LatentDType != model.F32 {
		return cfg, nil, fmt.Errorf("worker: MLA cache dtype %s; want BF16 or F32", cfg.LatentDType)
	}
	be := cfg.Backend
	if be == nil {
		be = cpu.New(cfg.Threads)
	}
	cfg.Backend = be
	return cfg, be, nil
}

// New opens the model, allocates the ring and starts serving.
func New(cfg Config) (*Worker, error) {
	info, err := Inspect(cfg)
	if err != nil {
		return nil, err
	}
	cfg, be, _ := cfg.withDefaults()
	mc, lay, emb, costs := info.Model, info.Layout, info.Embed, info.Costs
	// The vision tower, when the checkpoint has one, stays resident: its
	// weights come out of the budget the passes plan with.
	tower, err := loadTower(cfg, be)
	if err != nil {
		return nil, err
	}
	if tower != nil {
		if tower.bytes >= cfg.Budget {
			tower.close()
			return nil, fmt.Errorf("worker: %s: the vision tower's weights (%s) take the whole memory budget (%s): raise it", cfg.Model, humanBytes(tower.bytes), humanBytes(cfg.Budget))
		}
		cfg.Budget -= tower.bytes
	}
	// The ring is sized once: the plan of an empty queue picks the depth.
	p, err := planner.Make(planner.Input{Costs: costs, Budget: cfg.Budget, Depth: cfg.Depth, MaxTile: cfg.MaxTile})
	if err == nil {
		if dm, ok := be.(kernels.DeviceMemory); ok {
			// The tower is bound already: the device's free memory is
			// what is left after it.
			err = planDevice(dm, be.Name(), mc, lay.SlotBytes, costs, p.Tile, cfg.Log)
		}
	}
	if err != nil {
		tower.close()
		return nil, fmt.Errorf("worker: %s: %w", cfg.Model, err)
	}
	st, err := streamer.New(lay, be, streamer.Options{Slots: p.Depth + 1, ReadSize: cfg.ReadSize, Readers: cfg.Readers, IO: cfg.IO, Log: cfg.Log})
	if err != nil {
		tower.close()
		return nil, err
	}
	m := model.New(mc, be)
	m.State.LatentDType = cfg.LatentDType
	exec := &executor.Executor{Model: m, Stream: st, Embed: emb, Log: cfg.Log}
	w := &Worker{cfg: cfg, exec: exec, model: mc, stream: st, costs: costs, depth: p.Depth, done: make(chan error, 1), tower: tower,
		images: imagejob.NewEncoder(mc, tower.features(), "this prefill worker"),
		cost:   costmodel.New(&mc.Config, cfg.LatentDType.Size()), fit: costmodel.NewFitter(costmodel.Compute{})}
	w.sched = scheduler.New(scheduler.Config{Exec: exec, Costs: costs, Budget: cfg.Budget, Depth: p.Depth, MaxTile: cfg.MaxTile,
		SinkQueue: cfg.SinkQueue, SinkTimeout: cfg.SinkTimeout, CloseTimeout: cfg.CloseTimeout, Log: cfg.Log, OnPass: w.onPass, OnLayer: cfg.OnLayer,
		SerialEncode: isDevice(be)})
	cfg.Log.Info("prefill worker ready", zap.String("model", cfg.Model), zap.Int("layers", mc.NumLayers),
		zap.String("layer_bytes", humanBytes(lay.TensorBytes)), zap.String("budget", humanBytes(cfg.Budget)),
		zap.Int("depth", p.Depth), zap.String("ring", humanBytes(p.Mem.Ring)), zap.String("io", st.IOName()),
		zap.String("backend", be.Name()), zap.String("cache_dtype", cfg.LatentDType.String()), zap.String("vision_tower", humanBytes(tower.size())))
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go func() { w.done <- w.sched.Run(ctx) }()
	return w, nil
}

// Job is a submitted job, a scheduler.Job with Wait, Done and Result.
type Job = scheduler.Job

// Spec describes a job as scheduler.Spec does. Tokens are the prompt
// without its last token.
type Spec = scheduler.Spec

// Submit queues a job for the next pass.
func (w *Worker) Submit(spec Spec) (*Job, error) {
	js, err := w.SubmitAll([]Spec{spec})
	if err != nil {
		return nil, err
	}
	return js[0], nil
}

// SubmitAll queues several jobs atomically, so that they share a pass.
func (w *Worker) SubmitAll(specs []Spec) ([]*Job, error) {
	specs = slices.Clone(specs)
	for i := range specs {
		specs[i] = w.withStore(specs[i])
	}
	js, err := w.sched.SubmitAll(specs)
	if err != nil {
		untee(specs)
	}
	return js, err
}

// Cancel cancels a job; a job in a pass leaves it at the next layer.
func (w *Worker) Cancel(id string) bool { return w.sched.Cancel(id) }

// onPass feeds a finished pass to the cost model's inputs, then calls the
// configured OnPass.
func (w *Worker) onPass(rep scheduler.PassReport) {
	st := rep.Stats
	if st.ReadBusy > 0 && st.Bytes > 0 {
		w.readMu.Lock()
		w.read += st.Bytes
		w.readBusy += st.ReadBusy
		w.readMu.Unlock()
	}
	if s, ok := passSample(w.cost, rep); ok {
		if err := w.fit.Add(s); err != nil {
			w.cfg.Log.Debug("pass not fitted", zap.Int("pass", rep.Pass), zap.Error(err))
		}
	}
	if w.cfg.OnPass != nil {
		w.cfg.OnPass(rep)
	}
}

// passSample is a whole pass as a sample of the compute terms: the work of
// its pieces, its layers, its compute time. It counts one call per layer,
// as the router and the simulator price a pass: the executor cuts a layer
// into calls by their work (and rows), so those calls grow with the work
// like the linear terms, and counted as calls they made the fixed cost
// per call and the linear rate inseparable (the fit could move the work
// into a per-call cost that the router, pricing one call per layer, then
// left out). A pass that failed or that jobs left before its end ran less
// work than planned and is not one.
func passSample(m *costmodel.Model, rep scheduler.PassReport) (costmodel.Sample, bool) {
	st, plan := rep.Stats, rep.Plan
	if rep.Err != nil || st.Layers != m.Layers || st.Compute <= 0 || st.Tokens != plan.Tokens || len(plan.Pieces) == 0 {
		return costmodel.Sample{}, false
	}
	var work costmodel.FLOPs
	for _, pc := range plan.Pieces {
		work = work.Add(m.Work(pc.Lo, pc.Hi))
	}
	return costmodel.Sample{Work: work, Calls: m.Layers, Took: st.Compute, Attention: st.Attention}, true
}

// Stats are the worker's counters and rates.
type Stats struct {
	scheduler.Stats
	// PrefillTokensPerSec is tokens prefilled per second of compute.
	PrefillTokensPerSec float64
	// ReadBytesPerSec is the weights' read rate, the bytes read over the
	// time reads were in flight, over every pass, so that a pass that
	// compute held back still measures the disk. PassFloor is what one
	// pass's reads take at that rate, the floor of a pass with nothing to
	// compute. Both are zero before the first pass.
	ReadBytesPerSec float64
	PassFloor       time.Duration
	// Compute is the compute per cost-model term fitted to the finished
	// passes, zero before the first, from ComputeSamples of them, with a
	// largest relative error of ComputeWorst.
	Compute        costmodel.Compute
	ComputeSamples int
	ComputeWorst   float64
}

// Stats returns the counters and the rates a control plane reports.
func (w *Worker) Stats() Stats {
	s := Stats{Stats: w.sched.Stats()}
	if s.ComputeTime > 0 {
		s.PrefillTokensPerSec = float64(s.TokensPrefilled) / s.ComputeTime.Seconds()
	}
	w.readMu.Lock()
	read, busy := w.read, w.readBusy
	w.readMu.Unlock()
	if read > 0 && busy > 0 {
		s.ReadBytesPerSec = float64(read) / busy.Seconds()
		s.PassFloor = time.Duration(float64(w.stream.Layout().ReadBytes) / s.ReadBytesPerSec * float64(time.Second))
	}
	s.Compute, s.ComputeSamples, s.ComputeWorst = w.fit.Compute()
	return s
}

// CostModel is the cost model's view of the worker's model.
func (w *Worker) CostModel() *costmodel.Model { return w.cost }

// Plan is what a pass over jobs of the given prompt lengths, the tokens to
// prefill each, would do, without running it: the --dry-run answer.
func (w *Worker) Plan(lens []int) (planner.Plan, error) {
	jobs := make([]planner.Job, len(lens))
	for i, n := range lens {
		jobs[i] = planner.Job{ID: fmt.Sprintf("prompt%d", i), Total: n}
	}
	return w.sched.Plan(jobs)
}

// Model is the model's configuration.
func (w *Worker) Model() *model.Config { return w.model }

// LatentDType is the MLA cache dtype of the states the worker produces.
func (w *Worker) LatentDType() model.DType { return w.cfg.LatentDType }

// Depth is the prefetch depth of every pass.
func (w *Worker) Depth() int { return w.depth }

// Costs is the planner's memory model of this worker.
func (w *Worker) Costs() planner.Costs { return w.costs }

// Streamer exposes the weight streamer to benchmarks, for RawRead,
// read-only passes and the I/O mode. Its passes must not overlap the
// worker's, so use it only while no job is queued or running.
func (w *Worker) Streamer() *streamer.Streamer { return w.stream }

// Executor exposes the pass executor to benchmarks that time a pass at
// another depth, under the same rule as Streamer.
func (w *Worker) Executor() *executor.Executor { return w.exec }

// Close stops serving: unfinished jobs fail, the pass in progress stops at
// the next layer, and the ring is freed.
func (w *Worker) Close() error {
	w.cancel()
	err := <-w.done
	w.done <- err // Close may be called again
	w.stream.Close()
	w.tower.close()
	w.tower = nil
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// deviceReserve is the share of free device memory left to the driver, the
// kernels' modules and fragmentation.
const deviceReserve = 0.1

// planDevice checks that a device backend can run a pass of one tile: the
// plan of how layers stream through its memory, logged. The executor binds
// one whole layer at a time, so a plan that needs layer parts (two layers do
// not fit) runs only while one layer and the working set fit; otherwise it
// is refused here, before anything is read, saying so.
func planDevice(dm kernels.DeviceMemory, name string, mc *model.Config, layerBytes int64, costs planner.Costs, tile int, log *zap.Logger) error {
	free, total := dm.DeviceMemory()
	l := planner.ConfigLayer(mc, layerBytes)
	dp, err := planner.PlanDevice(planner.DeviceInput{Device: int64(float64(free) * (1 - deviceReserve)), Layer: l, Costs: costs, Tokens: tile, Tile: tile, Seqs: 1})
	if err != nil {
		return fmt.Errorf("%s (%s free of %s): %w", name, humanBytes(free), humanBytes(total), err)
	}
	log.Info("device plan", zap.String("backend", name), zap.String("mode", dp.Mode.String()), zap.Int("experts_per_part", dp.GroupExperts),
		zap.Int("parts_per_layer", dp.Parts), zap.String("weights_peak", humanBytes(dp.Weights)), zap.String("working_set", humanBytes(dp.Working)),
		zap.String("device_free", humanBytes(free)))
	if dp.Mode == planner.LayerParts && l.Bytes()+dp.Working > dp.Device {
		return fmt.Errorf("%w: %s holds %s for a pass, but a layer (%s) and the working set (%s) need more; the plan streams layers in parts of %d experts, which the executor does not do yet: use a GPU with more memory",
			planner.ErrBudget, name, humanBytes(dp.Device), humanBytes(l.Bytes()), humanBytes(dp.Working), dp.GroupExperts)
	}
	return nil
}
