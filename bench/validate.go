package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/conformance"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kernels/cuda"
	"github.com/tandem-inference/tandem/kernels/metal"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/synth"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

func init() {
	register(command{"validate", "what a GPU or Mac owner runs: conformance on the device, then per-op throughput and a streamed pass (cuda), or decode steps against the bandwidth ceiling and local prefill (metal) (Markdown + JSON + PNG)", stages(parseValidateFlags, runValidate)})
}

// Targets of issue 13 (each a ratio against a limit measured in the run).
const (
	targetGEMM   = 0.70 // BF16 GEMM at K3 prefill shapes vs the BF16 GEMM limit
	targetMoE    = 0.35 // a K3-width MoE layer vs the BF16 GEMM limit
	targetH2D    = 0.80 // the streamed pass's upload rate vs the pinned copy rate
	targetPassOK = 1.15 // pass_s / max(H2D of every layer, compute)
)

// validateReport is validate.json.
type validateReport struct {
	Backend     string              `json:"backend"`
	Device      string              `json:"device"`
	Conformance *conformance.Report `json:"conformance"`
	ConformOK   bool                `json:"conformance_pass"`
	Limits      validateLimits      `json:"limits"`
	Ops         []opFigure          `json:"ops"`
	Pass        *passFigure         `json:"pass,omitempty"`
	Decode      *decodeFigure       `json:"decode,omitempty"`
	Notes       []string            `json:"notes"`
}

// validateLimits are the rates measured in the same run that every figure
// is a ratio against.
type validateLimits struct {
	GEMMTFLOPs  float64 `json:"bf16_gemm_tflops"`
	GEMMShape   string  `json:"bf16_gemm_shape"`
	HBMCopyGBps float64 `json:"device_copy_gbps"`
	H2DGBps     float64 `json:"pinned_h2d_gbps"`
}

type opFigure struct {
	Op     string   `json:"op"`
	Shape  string   `json:"shape"`
	Secs   float64  `json:"seconds"`
	Rate   float64  `json:"rate"`
	Unit   string   `json:"unit"`
	Limit  float64  `json:"limit"`
	Ratio  float64  `json:"ratio"`
	Target float64  `json:"target,omitempty"`
	Met    *bool    `json:"met,omitempty"`
	Notes  []string `json:"notes,omitempty"`
}

type passFigure struct {
	Model        string  `json:"model"`
	Layers       int     `json:"layers"`
	Tokens       int     `json:"tokens"`
	WeightsBytes int64   `json:"weights_bytes"`
	PassS        float64 `json:"pass_s"`
	ComputeS     float64 `json:"compute_s"`
	H2DS         float64 `json:"h2d_s"`
	ReadGBps     float64 `json:"read_gbps"`
	Bound        float64 `json:"bound_s"`
	Ratio        float64 `json:"ratio"`
	Met          bool    `json:"met"`
}

// validateConfig is bench validate's configuration, from its flags, with
// the backend's defaults filled in.
type validateConfig struct {
	backend, out, model, passModel string
	only                           string
	full                           bool
	tokens, experts, topK          int
	passTokens                     int
	copyMiB                        int
	budget                         string
	device                         int
	decode                         bool // decode figures instead of the prefill ones
	greedyTokens                   int
}

// parseValidateFlags parses bench validate's command line and fills in the
// defaults of the backend for sizes not given. After --help it returns
// pflag.ErrHelp.
func parseValidateFlags(args []string) (validateConfig, error) {
	fs := pflag.NewFlagSet("validate", pflag.ContinueOnError)
	var f validateConfig
	fs.StringVar(&f.backend, "backend", "cuda", "backend to validate: cuda (the prefill GPU), metal (a Mac's GPU: decode figures), or cpu (the same steps on the reference, to check the command)")
	fs.BoolVar(&f.decode, "decode", false, "the decode figures (decode steps against the bandwidth ceiling, local prefill, greedy ids) instead of the prefill ones; always on with --backend metal")
	fs.IntVar(&f.greedyTokens, "greedy-tokens", 8, "decode figures: greedy tokens per prompt compared with the CPU backend")
	fs.IntVar(&f.device, "cuda-device", 0, "CUDA device ordinal")
	fs.StringVar(&f.out, "out", "validate-report", "directory for validate.md, validate.json and validate.png")
	fs.StringVar(&f.model, "model", "", "checkpoint for conformance's layer and model checks (default: the tiny synthetic preset, generated once)")
	fs.StringVar(&f.passModel, "pass-model", "", "checkpoint for the streamed pass, or the decode figures' model (default: the small synthetic preset on cuda and metal, tiny on cpu)")
	fs.BoolVar(&f.full, "full", false, "the whole conformance suite instead of its CI subset")
	fs.StringVar(&f.only, "only", "", "run only the conformance cases whose names contain one of these (comma-separated)")
	fs.IntVar(&f.tokens, "tokens", 0, "rows of the per-op figures (default 8192 on cuda: K3 prefill shapes; 32 on cpu)")
	fs.IntVar(&f.experts, "experts", 0, "routed experts of the MoE figure (default 896, K3's, on cuda; 4 on cpu)")
	fs.IntVar(&f.topK, "top-k", 0, "experts per token of the MoE figure (default 16 on cuda; 2 on cpu)")
	fs.IntVar(&f.passTokens, "pass-tokens", 0, "prompt tokens of the streamed pass or of the decode figures' local prefill (default 4096 on cuda, 512 on metal; 64 on cpu)")
	fs.IntVar(&f.copyMiB, "copy-mib", 0, "size of the copy-rate measurements (default 1024 on cuda; 32 on cpu)")
	fs.StringVar(&f.budget, "memory-budget", "", "host memory budget of the streamed pass, a byte size (default 16GiB on cuda; 512MiB on cpu)")
	config.Alias(fs, "mem-budget", "memory-budget")
	if err := parseFlags(fs, args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	f.fillDefaults()
	return f, nil
}

// fillDefaults sets the sizes not given to the backend's: K3 prefill
// shapes on cuda, small ones on cpu, decode figures on metal.
func (f *validateConfig) fillDefaults() {
	gpu := f.backend == "cuda"
	if f.backend == "metal" {
		f.decode = true
	}
	def := func(v *int, g, c int) {
		if *v == 0 {
			*v = c
			if gpu {
				*v = g
			}
		}
	}
	def(&f.tokens, 8192, 32)
	def(&f.experts, 896, 4)
	def(&f.topK, 16, 2)
	def(&f.passTokens, 4096, 64)
	if f.backend == "metal" && f.passTokens == 64 {
		f.passTokens = 512
	}
	def(&f.copyMiB, 1024, 32)
	if f.backend == "metal" && f.copyMiB == 32 {
		f.copyMiB = 1024
	}
	if f.budget == "" {
		f.budget = "512MiB"
		if gpu {
			f.budget = "16GiB"
		}
	}
}

// validate checks the flags on their own (after fillDefaults).
func (f validateConfig) validate() error {
	switch f.backend {
	case "cuda", "metal", "cpu":
	default:
		return fmt.Errorf("backend %q: want cuda, metal or cpu", f.backend)
	}
	for _, v := range []struct {
		flag string
		n    int
	}{{"--tokens", f.tokens}, {"--experts", f.experts}, {"--top-k", f.topK}, {"--pass-tokens", f.passTokens}, {"--copy-mib", f.copyMiB}} {
		if v.n < 0 {
			return fmt.Errorf("%s %d: want a positive number (0 or none for the backend's default)", v.flag, v.n)
		}
	}
	if f.topK > f.experts {
		return fmt.Errorf("--top-k %d --experts %d: want at most as many experts per token as experts", f.topK, f.experts)
	}
	if f.greedyTokens < 0 {
		return fmt.Errorf("--greedy-tokens %d: want 0 or more", f.greedyTokens)
	}
	if _, err := config.ParseBytes(f.budget); err != nil {
		return fmt.Errorf("--memory-budget: %w", err)
	}
	return nil
}

// validateLog prints a line of bench validate's progress to stdout.
func validateLog(format string, a ...any) { fmt.Printf(format+"\n", a...) }

func runValidate(ctx context.Context, f validateConfig) error {
	rep := &validateReport{Backend: f.backend}
	be, closeBackend, err := openBackend(f, rep)
	if err != nil {
		return err
	}
	defer closeBackend()
	if err := os.MkdirAll(f.out, 0o755); err != nil {
		return err
	}
	// 1. Conformance on the backend.
	if err := runConformance(ctx, be, f, rep); err != nil {
		return err
	}
	if f.decode {
		validateLog("== decode figures")
		if err := measureRankDecode(ctx, be, f, rep, validateLog); err != nil {
			return err
		}
		return writeValidate(f.out, rep)
	}
	// 2. Limits and per-op figures.
	validateLog("== limits and per-op throughput")
	if err := measureOps(be, f, rep, validateLog); err != nil {
		return err
	}
	// 3. A streamed pass.
	validateLog("== streamed pass")
	if err := measurePass(ctx, be, f, rep, validateLog); err != nil {
		return err
	}
	return writeValidate(f.out, rep)
}

// openBackend opens the backend of f and records its device in rep.
func openBackend(f validateConfig, rep *validateReport) (kernels.Backend, func(), error) {
	switch f.backend {
	case "cuda":
		b, err := cuda.Open(cuda.Options{Device: f.device})
		if err != nil {
			return nil, nil, err
		}
		in := b.Info()
		rep.Device = fmt.Sprintf("%s (sm_%d%d, %d SMs, %s, driver %d)", in.Name, in.CC[0], in.CC[1], in.SMs, progress.HumanBytes(int64(in.TotalMem)), in.DriverVersion)
		return b, func() { b.Close() }, nil
	case "metal":
		b, err := metal.Open()
		if err != nil {
			return nil, nil, err
		}
		_, total := b.DeviceMemory()
		rep.Device = fmt.Sprintf("%s (working set %s)", b.Name(), progress.HumanBytes(total))
		return b, func() { b.Close() }, nil
	case "cpu":
		rep.Device = "host CPU"
		rep.Notes = append(rep.Notes, "run on the CPU reference: these figures check the command, not a GPU")
		return cpu.New(0), func() {}, nil
	}
	return nil, nil, fmt.Errorf("backend %q: want cuda, metal or cpu", f.backend)
}

// runConformance runs the conformance suite (its CI subset unless --full)
// on be against --model, or the tiny synthetic preset.
func runConformance(ctx context.Context, be kernels.Backend, f validateConfig, rep *validateReport) error {
	modelDir := f.model
	if modelDir == "" {
		var err error
		if modelDir, err = synth.Ensure(ctx, synth.CacheDir(), "tiny", 1, 1); err != nil {
			return err
		}
	}
	validateLog("== conformance on %s (%s)", be.Name(), rep.Device)
	var only []string
	if f.only != "" {
		only = strings.Split(f.only, ",")
	}
	cr, err := conformance.Run(ctx, be, conformance.Options{Short: !f.full, ModelDir: modelDir, Only: only, Absorbed: f.decode, Log: func(s string) { validateLog("%s", s) }})
	if err != nil {
		return err
	}
	rep.Conformance, rep.ConformOK = cr, len(cr.Failed()) == 0
	return nil
}

// syncOn waits for every op issued before it: a one-value copy of t
// downloaded (Download waits on a device backend's stream).
func syncOn(be kernels.Backend, t *kernels.Tensor) {
	one := be.NewTensor(1, 1)
	be.CopyBlock(one, 0, 0, t, 0, 0, 1, 1)
	v := make([]float32, 1)
	be.Download(v, one)
	be.Free(one)
}

// best runs fn n times and returns the shortest time.
func best(n int, fn func() time.Duration) time.Duration {
	b := time.Duration(math.MaxInt64)
	for i := 0; i < n; i++ {
		b = min(b, fn())
	}
	return b
}

// randomMXFP4 fills an MXFP4 weight with random codes directly (quantising
// real values, as conformance.RandomMatrix does, would take minutes for
// K3's 896 experts).
func randomMXFP4(name string, rows, cols int, seed uint64) *kernels.Matrix {
	m := &kernels.Matrix{Name: name, Rows: rows, Cols: cols, Format: kernels.MXFP4, Data: make([]byte, rows*cols/2), Scales: make([]byte, rows*cols/32)}
	x := seed*2654435761 + 7
	for i := range m.Data {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		m.Data[i] = byte(x >> 32)
	}
	for i := range m.Scales {
		m.Scales[i] = 127 - 6 // values of order 2^-6·6: unit-size outputs at width 3584
	}
	return m
}

// measureOps measures the limits, then the per-op figures against them.
func measureOps(be kernels.Backend, f validateConfig, rep *validateReport, logf func(string, ...any)) error {
	if err := measureLimits(be, f, rep, logf); err != nil {
		return err
	}
	T := f.tokens
	for _, s := range []struct {
		name       string
		rows, cols int
	}{{"q_a_proj", 1536, 7168}, {"latent down", 3584, 7168}, {"latent up", 7168, 3584}, {"kv_b_proj", 24576, 512}} {
		r, d := gemmRate(be, conformance.RandomMatrix(2, s.name, kernels.BF16, s.rows, s.cols), T)
		rep.addOp(opFigure{Op: "MatMul BF16 " + s.name, Shape: fmt.Sprintf("%d x %d -> %d", T, s.cols, s.rows), Secs: d.Seconds(), Rate: r, Unit: "TFLOP/s",
			Limit: rep.Limits.GEMMTFLOPs, Target: targetGEMM}, logf)
	}
	o, err := moeFigure(be, T, f.experts, f.topK)
	if err != nil {
		return err
	}
	o.Limit = rep.Limits.GEMMTFLOPs
	rep.addOp(o, logf)
	o = rmsNormFigure(be, T)
	o.Limit = rep.Limits.HBMCopyGBps
	rep.addOp(o, logf)
	return nil
}

// addOp adds figure o with its ratio to the limit and whether it met its
// target, and logs it.
func (rep *validateReport) addOp(o opFigure, logf func(string, ...any)) {
	o.Ratio = o.Rate / o.Limit
	if o.Target > 0 {
		met := o.Ratio >= o.Target
		o.Met = &met
	}
	rep.Ops = append(rep.Ops, o)
	logf("%-26s %-40s %8.3f %s  %.2f of the limit", o.Op, o.Shape, o.Rate, o.Unit, o.Ratio)
}

// measureLimits measures the rates the figures are held to: the pinned
// host-to-device copy, the device copy and the best BF16 GEMM over large
// shapes.
func measureLimits(be kernels.Backend, f validateConfig, rep *validateReport, logf func(string, ...any)) error {
	var err error
	if rep.Limits.H2DGBps, err = pinnedH2D(be, f.copyMiB); err != nil {
		return err
	}
	// Device copy: read and write every byte once.
	rep.Limits.HBMCopyGBps = copyRate(be, f.copyMiB<<20)
	// BF16 GEMM: the best rate of this backend's MatMul over large shapes
	// is the limit the K3 shapes are held to.
	T := f.tokens
	side := 7168
	if T < 1024 {
		side = 1024
	}
	for _, s := range [][2]int{{side, side}, {2 * side, side}} {
		r, _ := gemmRate(be, conformance.RandomMatrix(1, "limit", kernels.BF16, s[0], s[1]), T)
		if r > rep.Limits.GEMMTFLOPs {
			rep.Limits.GEMMTFLOPs, rep.Limits.GEMMShape = r, fmt.Sprintf("%dx%d·%dx%dᵀ", T, s[1], s[0], s[1])
		}
	}
	rep.Notes = append(rep.Notes, "the BF16 GEMM limit is this backend's best MatMul over large shapes (cuBLASLt's with TANDEM_CUBLASLT=1, else the backend's own kernel), so GEMM ratios measure shape efficiency against that, not necessarily the GPU's peak")
	logf("limits: BF16 GEMM %.2f TFLOP/s (%s), device copy %.1f GB/s, pinned H2D %.1f GB/s",
		rep.Limits.GEMMTFLOPs, rep.Limits.GEMMShape, rep.Limits.HBMCopyGBps, rep.Limits.H2DGBps)
	return nil
}

// pinnedH2D is the pinned host -> device rate in GB/s over copyMiB MiB:
// Bind of a weight whose bytes are AllocHost memory, as the streamer's ring
// slots are.
func pinnedH2D(be kernels.Backend, copyMiB int) (float64, error) {
	n := copyMiB << 20
	host, err := be.AllocHost(n)
	if err != nil {
		return 0, fmt.Errorf("pinned host memory of %d MiB: %w", copyMiB, err)
	}
	defer be.FreeHost(host)
	cols := 4096
	w := &kernels.Matrix{Name: "h2d", Rows: n / (2 * cols), Cols: cols, Format: kernels.BF16, Data: host[:n/(2*cols)*2*cols]}
	probe := be.NewTensor(1, 1)
	defer be.Free(probe)
	var bindErr error
	d := best(3, func() time.Duration {
		t := time.Now()
		if err := be.Bind(w); err != nil {
			bindErr = err
			return time.Hour
		}
		syncOn(be, probe)
		el := time.Since(t)
		be.Release(w)
		return el
	})
	if bindErr != nil {
		return 0, bindErr
	}
	return float64(len(w.Data)) / d.Seconds() / 1e9, nil
}

// gemmRate binds m and times rows x m.Cols times m transposed (best of 3),
// in TFLOP/s. It panics if m cannot be bound.
func gemmRate(be kernels.Backend, m *kernels.Matrix, rows int) (float64, time.Duration) {
	if err := be.Bind(m); err != nil {
		panic(err)
	}
	defer be.Release(m)
	x, y := be.NewTensor(rows, m.Cols), be.NewTensor(rows, m.Rows)
	defer be.Free(x)
	defer be.Free(y)
	d := best(3, func() time.Duration {
		t := time.Now()
		be.MatMul(y, x, m)
		syncOn(be, y)
		return time.Since(t)
	})
	return 2 * float64(rows) * float64(m.Rows) * float64(m.Cols) / d.Seconds() / 1e12, d
}

// moeFigure times a K3-width MoE layer's routed experts: T tokens, E
// experts, top k (best of 2). The limit is the caller's to set.
func moeFigure(be kernels.Backend, T, E, k int) (opFigure, error) {
	inter, lat := 3072, 3584
	ex := make([]kernels.Expert, E)
	var bound []*kernels.Matrix
	defer func() {
		for _, m := range bound {
			be.Release(m)
		}
	}()
	for e := range ex {
		ex[e] = kernels.Expert{W1: randomMXFP4("w1", inter, lat, uint64(3*e)), W3: randomMXFP4("w3", inter, lat, uint64(3*e+1)), W2: randomMXFP4("w2", lat, inter, uint64(3*e+2))}
		for _, m := range []*kernels.Matrix{ex[e].W1, ex[e].W3, ex[e].W2} {
			if err := be.Bind(m); err != nil {
				return opFigure{}, fmt.Errorf("binding %d experts: %w", E, err)
			}
			bound = append(bound, m)
		}
	}
	ids, wts := make([]int32, T*k), make([]float32, T*k)
	for r := 0; r < T; r++ {
		for j := 0; j < k; j++ {
			ids[r*k+j] = int32((r*7 + j*(E/k+1)) % E)
			wts[r*k+j] = 1 / float32(k)
		}
	}
	z, u := be.NewTensor(T, lat), be.NewTensor(T, lat)
	d := best(2, func() time.Duration {
		t := time.Now()
		be.RoutedExperts(u, z, ids, wts, k, ex, 4, 25)
		syncOn(be, u)
		return time.Since(t)
	})
	be.Free(z)
	be.Free(u)
	flops := 2 * 3 * float64(T*k) * float64(inter) * float64(lat)
	return opFigure{Op: "RoutedExperts MXFP4", Shape: fmt.Sprintf("%d tokens, %d experts, top %d, %dx%d", T, E, k, inter, lat), Secs: d.Seconds(),
		Rate: flops / d.Seconds() / 1e12, Unit: "TFLOP/s", Target: targetMoE}, nil
}

// rmsNormFigure times a bandwidth-bound op: RMSNorm over the hidden width
// of T rows reads and writes every value once (best of 3). The limit is
// the caller's to set.
func rmsNormFigure(be kernels.Backend, T int) opFigure {
	x := be.NewTensor(T, 7168)
	nw := make([]float32, 7168)
	for i := range nw {
		nw[i] = 1
	}
	d := best(3, func() time.Duration {
		t := time.Now()
		be.RMSNorm(x, x, nw, 0, 1e-5)
		syncOn(be, x)
		return time.Since(t)
	})
	be.Free(x)
	return opFigure{Op: "RMSNorm", Shape: fmt.Sprintf("%d x 7168", T), Secs: d.Seconds(), Rate: 2 * float64(T*7168*4) / d.Seconds() / 1e9, Unit: "GB/s"}
}

// checkpoint is --pass-model, or a synthetic one made (once, cached) for
// the run: small on the device the measurement is for (the GPU's figures
// want more work than the tiny preset gives), tiny elsewhere.
func (f validateConfig) checkpoint(ctx context.Context, device string) (string, error) {
	if f.passModel != "" {
		return f.passModel, nil
	}
	preset := "tiny"
	if f.backend == device {
		preset = "small"
	}
	return synth.Ensure(ctx, synth.CacheDir(), preset, 1, 1)
}

// measurePass runs one prompt through every layer of a checkpoint streamed
// from disk, and holds pass_s to max(every layer's upload at the pinned
// rate, the pass's compute).
func measurePass(ctx context.Context, be kernels.Backend, f validateConfig, rep *validateReport, logf func(string, ...any)) error {
	dir, err := f.checkpoint(ctx, "cuda")
	if err != nil {
		return err
	}
	budget, err := config.ParseBytes(f.budget)
	if err != nil {
		return err
	}
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	var last scheduler.PassReport
	w, err := worker.New(worker.Config{Model: dir, Budget: budget, Depth: -1, Backend: be, OnPass: func(r scheduler.PassReport) { last = r }})
	if err != nil {
		return err
	}
	defer w.Close()
	cfg := w.Model()
	toks := make([]int32, f.passTokens)
	for i := range toks {
		toks[i] = int32((i*7919 + 13) % cfg.VocabSize)
	}
	chk := sink.NewCheck(cfg, len(toks), model.BF16)
	job, err := w.Submit(worker.Spec{ID: "validate", Tokens: toks, Sink: chk})
	if err != nil {
		return err
	}
	if err := job.Wait(ctx); err != nil {
		return fmt.Errorf("streamed pass: %w", err)
	}
	s := last.Stats
	weights := w.Streamer().Layout().TensorBytes
	p := &passFigure{Model: dir, Layers: cfg.NumLayers, Tokens: len(toks), WeightsBytes: weights, PassS: s.Wall.Seconds(), ComputeS: s.Compute.Seconds(),
		ReadGBps: float64(s.Bytes) / max(s.Wall.Seconds(), 1e-9) / 1e9}
	if rep.Limits.H2DGBps > 0 {
		p.H2DS = float64(weights) / (rep.Limits.H2DGBps * 1e9)
	}
	p.Bound = max(p.H2DS, p.ComputeS)
	p.Ratio = p.PassS / p.Bound
	p.Met = p.Ratio <= targetPassOK
	rep.Pass = p
	rep.Notes = append(rep.Notes, "the pass's compute_s is the executor's time binding and running layers (it includes waiting for each upload the compute depends on); the pass also reads the checkpoint from disk, whose rate (read_gbps) bounds it when slower than the upload")
	logf("pass: %d layers, %d tokens, %s: pass %.3f s, compute %.3f s, H2D of every layer %.3f s, read %.2f GB/s: %.2f x max(H2D, compute) (target <= %.2f)",
		p.Layers, p.Tokens, progress.HumanBytes(weights), p.PassS, p.ComputeS, p.H2DS, p.ReadGBps, p.Ratio, targetPassOK)
	return nil
}

func writeValidate(dir string, rep *validateReport) error {
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "validate.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	chart := report.StackedBars{Title: "per-op rate as a share of the limit measured in the same run", YLabel: "ratio"}
	var ratios []float64
	for _, o := range rep.Ops {
		chart.Categories = append(chart.Categories, o.Op)
		ratios = append(ratios, o.Ratio)
	}
	if rep.Pass != nil && rep.Pass.Ratio > 0 {
		chart.Categories = append(chart.Categories, "pass bound / pass_s")
		ratios = append(ratios, 1/rep.Pass.Ratio)
	}
	if d := rep.Decode; d != nil {
		chart.Categories = append(chart.Categories, "batch-1 step: ceiling / measured", "batch-16 speedup / 6")
		ratios = append(ratios, d.Ratio1, d.Speedup16/targetBatch16)
	}
	chart.Parts = []report.Part{{Name: "measured / limit", Values: ratios}}
	if err := chart.SavePNG(filepath.Join(dir, "validate.png")); err != nil {
		return err
	}
	var d report.Doc
	d.Heading(1, "tandem bench validate: "+rep.Backend)
	d.Para("Device: %s. Conformance: %s.", rep.Device, map[bool]string{true: "every case passed", false: fmt.Sprintf("%d case(s) FAILED", len(rep.Conformance.Failed()))}[rep.ConformOK])
	d.Heading(2, "Conformance")
	d.Para("%s", rep.Conformance.Markdown())
	if dec := rep.Decode; dec != nil {
		title, body := decodeMarkdown(dec)
		d.Heading(2, title)
		d.Para("%s", body)
	}
	if len(rep.Ops) > 0 {
		d.Heading(2, "Limits measured in this run")
		d.Bullets(fmt.Sprintf("BF16 GEMM: %.2f TFLOP/s (%s)", rep.Limits.GEMMTFLOPs, rep.Limits.GEMMShape),
			fmt.Sprintf("device copy: %.1f GB/s", rep.Limits.HBMCopyGBps), fmt.Sprintf("pinned host-to-device: %.1f GB/s", rep.Limits.H2DGBps))
	}
	t := &report.Table{Header: []string{"op", "shape", "rate", "limit", "ratio", "target"}}
	for _, o := range rep.Ops {
		tgt := ""
		if o.Met != nil {
			tgt = fmt.Sprintf(">= %.2f: %s", o.Target, map[bool]string{true: "met", false: "NOT met"}[*o.Met])
		}
		t.Add(o.Op, o.Shape, fmt.Sprintf("%.3f %s", o.Rate, o.Unit), fmt.Sprintf("%.3f", o.Limit), fmt.Sprintf("%.2f", o.Ratio), tgt)
	}
	if len(rep.Ops) > 0 {
		d.Heading(2, "Per-op throughput")
		d.Table(t)
	}
	if p := rep.Pass; p != nil {
		d.Heading(2, "Streamed pass")
		d.Para("%d layers of %s (%s), %d tokens: pass %.3f s; compute %.3f s; every layer's upload at the pinned rate %.3f s; read %.2f GB/s. pass_s / max(H2D, compute) = %.2f (target <= %.2f: %s).",
			p.Layers, p.Model, progress.HumanBytes(p.WeightsBytes), p.Tokens, p.PassS, p.ComputeS, p.H2DS, p.ReadGBps, p.Ratio, targetPassOK, map[bool]string{true: "met", false: "NOT met"}[p.Met])
	}
	d.Image("ratios", "validate.png")
	if len(rep.Notes) > 0 {
		d.Heading(2, "Notes")
		d.Bullets(rep.Notes...)
	}
	return d.WriteFile(filepath.Join(dir, "validate.md"))
}
