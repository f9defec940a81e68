package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"text/template"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/bench/sim"
	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/synth"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

func init() {
	register(command{name: "calibrate", short: "measure this machine (disk, compute per layer type, loopback link, decode group) and write it as a hardware profile", run: stages(parseCalibrateFlags, runCalibrate)})
}

// calibrateConfig is bench calibrate's configuration, from its flags.
type calibrateConfig struct {
	model, preset, out, io, budget, tokens string
	threads, ranks, reps                   int
	asJSON                                 bool
}

// calibration is what bench calibrate measured (the JSON line).
type calibration struct {
	Model   string `json:"model"`
	Threads int    `json:"threads"`
	Ranks   int    `json:"ranks"`
	CPUs    int    `json:"cpus"`
	// Disk: a read-only weight pass through the streamer.
	IOMode        string  `json:"io_mode"`
	PassBytes     int64   `json:"pass_bytes"`
	PassS         float64 `json:"pass_s"`
	DiskGBps      float64 `json:"disk_read_gb_per_s"`
	ReadLatencyMS float64 `json:"read_latency_ms"`
	ReadFit       string  `json:"read_fit,omitempty"`
	ComputeFit    struct {
		Rates      sim.Compute `json:"gflops"`
		OverheadMS float64     `json:"layer_overhead_ms"`
		Residual   float64     `json:"worst_residual"`
		Samples    int         `json:"samples"`
	} `json:"compute"`
	// Link: kvtransfer on loopback.
	LinkBytes int64   `json:"link_bytes"`
	LinkGBps  float64 `json:"link_gb_per_s"`
	LinkRTTUS float64 `json:"link_rtt_us"`
	// Decode group: an in-process group of Ranks ranks.
	DecodeStepMS       float64            `json:"decode_step_ms"`
	GroupPrefillS      map[string]float64 `json:"group_prefill_s"`
	GroupRates         sim.Compute        `json:"group_gflops"`
	GroupOverheadMS    float64            `json:"group_layer_overhead_ms"`
	GroupPrefillWorstE float64            `json:"group_prefill_worst_error"`
	Out                string             `json:"out"`
	TookS              float64            `json:"took_s"`
}

// parseCalibrateFlags parses bench calibrate's command line. After --help
// it returns pflag.ErrHelp.
func parseCalibrateFlags(args []string) (calibrateConfig, error) {
	var f calibrateConfig
	fs := pflag.NewFlagSet("calibrate", pflag.ContinueOnError)
	fs.StringVar(&f.model, "model", "", "checkpoint directory (default: the --preset synthetic model, generated into the test-model cache if needed)")
	fs.StringVar(&f.preset, "preset", "tiny", "synthetic model preset when --model is not given")
	fs.StringVar(&f.out, "out", "configs/hardware/local.yaml", "profile file to write")
	fs.StringVar(&f.io, "io", "auto", "streamer I/O mode: auto, direct or buffered")
	fs.StringVar(&f.budget, "memory-budget", "2GiB", "the prefill worker's memory budget to record in the profile, a byte size")
	config.Alias(fs, "budget", "memory-budget")
	fs.StringVar(&f.tokens, "tokens", "128,512,1536", "prompt lengths of the per-layer compute measurements")
	fs.IntVar(&f.threads, "threads", 1, "compute threads of the prefill worker and of each decode rank (as bench e2e runs them)")
	fs.IntVar(&f.ranks, "ranks", 2, "ranks of the decode group measured")
	fs.IntVar(&f.reps, "reps", 3, "repetitions of each measurement (the fastest is kept)")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object as the last line")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench calibrate [flags]

Measures this machine and writes it as a hardware profile for bench sim: the
disk read rate of a weight pass through the prefill worker's streamer (its
I/O mode), the CPU backend's compute rate per layer type (KDA, MLA, MoE,
dense) fitted to per-layer timings of a synthetic model, kvtransfer's rate and
round trip on loopback, and an in-process decode group's step time and local
prefill. bench sim --prefill FILE --decode FILE --link FILE --model PRESET
then predicts bench e2e on this machine.

`)
		fs.PrintDefaults()
	}
	return f, parseFlags(fs, args)
}

// validate checks the flags on their own.
func (f calibrateConfig) validate() error {
	if f.threads < 1 || f.ranks < 1 || f.reps < 1 {
		return errors.New("--threads, --ranks and --reps must be at least 1")
	}
	if _, err := config.ParseBytes(f.budget); err != nil {
		return fmt.Errorf("--memory-budget: %w", err)
	}
	if _, err := parseLengths(f.tokens); err != nil {
		return fmt.Errorf("--tokens %q: want prompt lengths, comma-separated (1..%d tokens)", f.tokens, 1<<24)
	}
	if _, err := streamer.ParseIOMode(f.io); err != nil {
		return fmt.Errorf("--io: %w", err)
	}
	return nil
}

func runCalibrate(ctx context.Context, f calibrateConfig) error {
	start := time.Now()
	dir, cfg, err := calibrationModel(ctx, f)
	if err != nil {
		return err
	}
	c := calibration{Model: dir, Threads: f.threads, Ranks: f.ranks, CPUs: runtime.NumCPU(), GroupPrefillS: map[string]float64{}}
	if err := measureMachine(ctx, f, dir, cfg, &c); err != nil {
		return err
	}
	if err := writeProfile(&c, f); err != nil {
		return err
	}
	c.Out = f.out
	c.TookS = time.Since(start).Seconds()
	say("calibrate: wrote %s in %.0f s", f.out, c.TookS)
	if f.asJSON {
		return report.JSONLine(os.Stdout, c)
	}
	return nil
}

// calibrationModel is the checkpoint of --model, or else the synthetic
// --preset model (generated into the test-model cache if needed), and its
// config.
func calibrationModel(ctx context.Context, f calibrateConfig) (string, *model.Config, error) {
	dir := f.model
	if dir == "" {
		say("calibrate: synthetic %s model (cache %s)", f.preset, synth.CacheDir())
		var err error
		if dir, err = synth.Ensure(ctx, synth.CacheDir(), f.preset, 1, 0); err != nil {
			return "", nil, err
		}
	}
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	return dir, cfg, err
}

// measureMachine measures the disk, the compute per layer type, the
// loopback link and the decode group into c, saying each as it goes.
func measureMachine(ctx context.Context, f calibrateConfig, dir string, cfg *model.Config, c *calibration) error {
	lengths, err := parseLengths(f.tokens)
	if err != nil {
		return err
	}
	iomode, err := streamer.ParseIOMode(f.io)
	if err != nil {
		return err
	}
	if err := calibrateDisk(ctx, dir, cfg, iomode, f.reps, c); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	say("calibrate: disk: %.3f ms + bytes at %.2f GB/s per layer (%s I/O); a %s pass at depth 2 in %.1f ms",
		c.ReadLatencyMS, c.DiskGBps, c.IOMode, report.Bytes(c.PassBytes), c.PassS*1e3)
	if err := calibrateCompute(ctx, dir, f.threads, lengths, f.reps, c); err != nil {
		return fmt.Errorf("compute: %w", err)
	}
	r := c.ComputeFit.Rates
	say("calibrate: compute (GFLOP/s): kda %.3g, mla %.3g, mla attention %.3g, moe %.3g, dense %.3g; %.3f ms per layer call; worst residual %.0f%% over %d layer timings",
		r.KDA, r.MLA, r.MLAAttention, r.MoE, r.Dense, c.ComputeFit.OverheadMS, 100*c.ComputeFit.Residual, c.ComputeFit.Samples)
	if err := calibrateLink(ctx, cfg, f.reps, c); err != nil {
		return fmt.Errorf("link: %w", err)
	}
	say("calibrate: loopback kvtransfer: %.2f GB/s, round trip %.0f us", c.LinkGBps, c.LinkRTTUS)
	if err := calibrateGroup(ctx, dir, cfg, f, c); err != nil {
		return fmt.Errorf("decode group: %w", err)
	}
	gr := c.GroupRates
	say("calibrate: decode group of %d ranks: step %.2f ms; local prefill %v s fitted by GFLOP/s kda %.3g, mla %.3g, mla attention %.3g, moe %.3g, dense %.3g and %.3f ms per layer and chunk (worst error %.0f%%)",
		f.ranks, c.DecodeStepMS, c.GroupPrefillS, gr.KDA, gr.MLA, gr.MLAAttention, gr.MoE, gr.Dense, c.GroupOverheadMS, 100*c.GroupPrefillWorstE)
	return nil
}

// writeProfile writes c as a hardware profile to --out, after checking
// that bench sim would parse it.
func writeProfile(c *calibration, f calibrateConfig) error {
	text, err := calibratedProfile(c, f)
	if err != nil {
		return err
	}
	if _, err := sim.ParseProfile(text, f.out); err != nil {
		return fmt.Errorf("the profile written would not parse: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(f.out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(f.out, text, 0o644)
}

func say(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// calibrateDisk reads the weights as the prefill worker does (the
// streamer, its I/O mode and readers): layer by layer with nothing read
// ahead, timing each layer (fastest of reps), fitted to a latency plus
// bytes at a rate; and whole passes read two layers ahead, for the rate a
// pass sees.
func calibrateDisk(ctx context.Context, dir string, cfg *model.Config, io streamer.IOMode, reps int, c *calibration) error {
	ck, err := safetensors.Open(dir)
	if err != nil {
		return err
	}
	lay, err := streamer.NewLayout(ck, cfg.NumLayers, streamer.DefaultAlign)
	ck.Close()
	if err != nil {
		return err
	}
	st, err := streamer.New(lay, cpu.New(1), streamer.Options{Slots: 3, IO: io})
	if err != nil {
		return err
	}
	defer st.Close()
	c.IOMode = st.IOName()
	if _, _, err := readOnlyPass(ctx, st, 2); err != nil { // open files, warm paths
		return err
	}
	best := make([]float64, len(lay.Layers))
	// The disk is shared and noisy: many cheap reps, the fastest kept.
	for rep := 0; rep < 5*reps; rep++ {
		p, err := st.Start(ctx, 0)
		if err != nil {
			return err
		}
		for L := range lay.Layers {
			t0 := time.Now()
			sl, err := p.Next(ctx)
			if err != nil {
				p.Close()
				return fmt.Errorf("layer %d: %w", L, err)
			}
			if d := time.Since(t0).Seconds(); best[L] == 0 || d < best[L] {
				best[L] = d
			}
			sl.Release()
		}
		if err := p.Close(); err != nil {
			return err
		}
	}
	sizes := make([]int64, len(lay.Layers))
	for L, l := range lay.Layers {
		sizes[L] = l.ReadBytes
	}
	if c.DiskGBps, c.ReadLatencyMS, err = sim.FitReads(sizes, best); err != nil {
		// Layers too alike in size (or too small) to tell latency from
		// rate: the rate of the summed layer reads, no latency.
		var n int64
		var t float64
		for L := range sizes {
			n += sizes[L]
			t += best[L]
		}
		c.DiskGBps, c.ReadLatencyMS = float64(n)/t/1e9, 0
		c.ReadFit = err.Error() + "; using the summed layer reads"
		say("calibrate: disk: %s", c.ReadFit)
	}
	for rep := 0; rep < 5*reps; rep++ {
		d, b, err := readOnlyPass(ctx, st, 2)
		if err != nil {
			return err
		}
		if c.PassS == 0 || d.Seconds() < c.PassS {
			c.PassS, c.PassBytes = d.Seconds(), b
		}
	}
	return nil
}

// calibrateCompute times every layer of the model over one sequence of each
// length on the CPU backend (fastest of reps) and fits the rates per layer
// type and the cost per layer call.
func calibrateCompute(ctx context.Context, dir string, threads int, lengths []int, reps int, c *calibration) error {
	m, err := model.Load(dir, cpu.New(threads), model.LoadOptions{Embed: true})
	if err != nil {
		return err
	}
	defer m.Close()
	var samples []sim.LayerSample
	for _, n := range lengths {
		best := make([]time.Duration, m.Cfg.NumLayers)
		for rep := 0; rep < reps; rep++ {
			s := m.NewState(0, m.Cfg.NumLayers)
			toks := make([]int32, n)
			for i := range toks {
				toks[i] = int32((i*7919 + 13 + rep) % m.Cfg.VocabSize)
			}
			b, err := m.NewBatch([]*model.SeqState{s}, [][]int32{toks})
			if err != nil {
				return err
			}
			for L := 0; L < m.Cfg.NumLayers; L++ {
				t0 := time.Now()
				if err := m.RunLayer(ctx, m.Layers[L], b, model.PhasePrefill); err != nil {
					return err
				}
				if d := time.Since(t0); best[L] == 0 || d < best[L] {
					best[L] = d
				}
			}
		}
		for L, d := range best {
			samples = append(samples, sim.LayerSample{Layer: L, Lo: 0, Hi: n, Seconds: d.Seconds()})
		}
	}
	fit, err := sim.FitCompute(m.Cfg, samples)
	if err != nil {
		return err
	}
	c.ComputeFit.Rates, c.ComputeFit.OverheadMS, c.ComputeFit.Residual, c.ComputeFit.Samples = fit.Rates, fit.OverheadMS, fit.WorstResidual, len(samples)
	return nil
}

// calibrateLink streams a state of about 64 MB through kvtransfer on
// loopback (one server, two connections, as bench transfer does) for the
// rate, and one small layer alone for the round trip of a commit.
func calibrateLink(ctx context.Context, cfg *model.Config, reps int, c *calibration) error {
	g, err := startGroup(cfg, 1, kvtransfer.DefaultChunkSize, kvtransfer.DefaultWindow)
	if err != nil {
		return err
	}
	defer g.close()
	sm := sim.NewModel("calibrate", cfg)
	tokens := 1
	if per := sm.StateBytes(1) - sm.StateBytes(0); per > 0 {
		tokens = int(max(1, (64<<20-sm.StateBytes(0))/per))
	}
	all := kvtest.AllLayers(cfg.NumLayers)
	src := kvtest.RandomSeq(cfg, all, tokens, model.BF16, 1)
	c.LinkBytes = int64(src.Bytes())
	var best, rtt time.Duration
	for rep := 0; rep < reps; rep++ {
		t, err := g.run(ctx, src, all, 2, nil, nil)
		if err != nil {
			return err
		}
		if best == 0 || t.total < best {
			best = t.total
		}
	}
	small := kvtest.RandomSeq(cfg, all, 1, model.BF16, 2)
	last := []int{cfg.NumLayers - 1}
	for rep := 0; rep < 3*reps; rep++ {
		t, err := g.run(ctx, small, last, 1, nil, nil)
		if err != nil {
			return err
		}
		if rtt == 0 || t.total < rtt {
			rtt = t.total
		}
	}
	c.LinkGBps = float64(c.LinkBytes) / best.Seconds() / 1e9
	c.LinkRTTUS = float64(rtt.Microseconds())
	return nil
}

// calibrateGroup starts an in-process decode group and measures its decode
// step and its own prefill of two prompts; the part of the prefill the
// compute rates do not explain becomes the group's cost per layer and chunk
// (the mesh hops, the stage loop).
func calibrateGroup(ctx context.Context, dir string, cfg *model.Config, f calibrateConfig, c *calibration) error {
	// The prefix cache is off: the repeated prompts are measured prefills.
	g, err := group.Start(ctx, group.Options{ModelDir: dir, Ranks: f.ranks, Threads: f.threads,
		PrefixCache: pipeline.PrefixCacheConfig{Off: true}})
	if err != nil {
		return err
	}
	defer g.Close()
	const gen = 33
	run := func(id string, n int) (pipeline.Result, error) {
		prompt := make([]int32, n)
		for i := range prompt {
			prompt[i] = int32((i*104729 + 7) % cfg.VocabSize)
		}
		col := group.NewCollector()
		if err := g.Head().Submit(ctx, pipeline.Request{ID: id, Tokens: prompt, MaxTokens: gen, Sink: col}); err != nil {
			return pipeline.Result{}, err
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		_, res, err := col.Wait(wctx, id)
		if err == nil && res.Err != nil {
			err = res.Err
		}
		if err == nil && res.Tokens != gen {
			err = fmt.Errorf("sequence %s generated %d tokens, want %d", id, res.Tokens, gen)
		}
		return res, err
	}
	if _, err := run("warm", 64); err != nil {
		return err
	}
	var steps []float64
	best := map[int]float64{}
	for rep := 0; rep < f.reps; rep++ {
		for _, n := range groupLengths {
			res, err := run(fmt.Sprintf("cal-%d-%d", n, rep), n)
			if err != nil {
				return err
			}
			tm := res.Timing
			steps = append(steps, tm.Ended.Sub(tm.FirstToken).Seconds()/float64(gen-1))
			if p := tm.FirstToken.Sub(tm.Admitted).Seconds(); best[n] == 0 || p < best[n] {
				best[n] = p
			}
		}
	}
	sort.Float64s(steps)
	step := steps[len(steps)/2]
	c.DecodeStepMS = step * 1e3
	var samples []sim.GroupSample
	for _, n := range groupLengths {
		samples = append(samples, sim.GroupSample{Prompt: n, Seconds: best[n]})
		c.GroupPrefillS[fmt.Sprint(n)] = best[n]
	}
	fit, err := sim.FitGroup(cfg, c.ComputeFit.Rates, groupChunk, step, samples)
	if err != nil {
		return err
	}
	c.GroupRates, c.GroupOverheadMS, c.GroupPrefillWorstE = fit.Rates, fit.OverheadMS, fit.WorstError
	return nil
}

// The decode group's local prefills measured, and its chunk (the
// decode-worker's default prefill_chunk).
var groupLengths = []int{128, 512, 1024, 1536}

const groupChunk = 512

var profileTemplate = template.Must(template.New("profile").Parse(`# This machine, measured by bench calibrate ({{.When}}); regenerate with
#   go run ./bench calibrate{{.Args}}
# Every figure is measured except memory_budget (the prefill worker's
# setting, --memory-budget) and the chunk and batch sizes (the decode group's
# defaults). bench sim --prefill local --decode local --link local
# --model {{.Preset}} predicts bench e2e on this machine.
name: local
description: this machine ({{.CPUs}} CPUs, {{.Threads}} compute thread(s) per service), CPU backend
prefill:
  # GB/s (1e9 bytes/s) and ms: each layer of the {{.Preset}} model read through the
  # streamer ({{.IOMode}} I/O) fitted to a latency plus bytes at a rate.
  # (A whole pass read two layers ahead took {{.PassMS}} ms for {{.PassBytes}}.)
  disk_read_gb_per_s: {{.Disk}}
  read_latency_ms: {{.ReadLat}}
  # The CPU computes in place: no upload.
  host_to_device_gb_per_s: 0
  # GFLOP/s per layer type, fitted to per-layer timings on the CPU backend
  # ({{.Threads}} thread(s), prompts of {{.Tokens}} tokens; worst residual {{.Residual}}).
  # Layer times fix only the sum of a layer's attention and feed-forward
  # costs; the split is the one closest to equal rates (bench/sim FitCompute).
  compute_gflops:
    kda: {{.KDA}}
    mla: {{.MLA}}
    mla_attention: {{.Attn}}
    moe: {{.MoE}}
    dense: {{.Dense}}
  # ms: fixed cost of one layer call, from the same fit.
  layer_overhead_ms: {{.Overhead}}
  # The prefill worker's memory budget (a byte size: 2GiB, 256GB).
  memory_budget: {{.Budget}}
  max_depth: 2
  max_tile: 0
  threads: {{.Threads}}
decode:
  # An in-process group of {{.Ranks}} ranks on this machine.
  ranks: {{.Ranks}}
  state_memory: ""
  # The group prefills with the same kernels, in chunks: the rates above
  # scaled by one factor for the linear work and one for the MLA attention,
  # plus a cost per layer and chunk (mesh hops, the stage loop), fitted to its
  # measured prefills of {{.GroupLengths}} tokens: {{.GroupPrefill}} s (worst error {{.GroupErr}}).
  compute_gflops:
    kda: {{.GKDA}}
    mla: {{.GMLA}}
    mla_attention: {{.GAttn}}
    moe: {{.GMoE}}
    dense: {{.GDense}}
  layer_overhead_ms: {{.GroupOverhead}}
  prefill_chunk: {{.Chunk}}
  # ms: one decode step of one sequence through every rank (median).
  decode_step_ms: {{.Step}}
  max_batch: 64
link:
  # GB/s: kvtransfer on loopback ({{.LinkBytes}} of state, two connections).
  gb_per_s: {{.Link}}
  # us: one small layer's transfer and commit.
  rtt_us: {{.RTT}}
measured:
  when: "{{.When}}"
  model: "{{.Model}}"
  go: "{{.Go}}"
  cpus: "{{.CPUs}}"
`))

func calibratedProfile(c *calibration, f calibrateConfig) ([]byte, error) {
	g := func(v float64) string { return fmt.Sprintf("%.4g", v) }
	var args []string
	if f.model != "" {
		args = append(args, "--model "+f.model)
	} else if f.preset != "tiny" {
		args = append(args, "--preset "+f.preset)
	}
	if f.threads != 1 {
		args = append(args, fmt.Sprintf("--threads %d", f.threads))
	}
	if f.ranks != 2 {
		args = append(args, fmt.Sprintf("--ranks %d", f.ranks))
	}
	if f.budget != "2GiB" {
		args = append(args, "--memory-budget "+f.budget)
	}
	args = append(args, "--out "+f.out)
	preset := f.preset
	if f.model != "" {
		preset = f.model
	}
	var gp, gl []string
	for _, n := range groupLengths {
		gp = append(gp, fmt.Sprintf("%.3f", c.GroupPrefillS[fmt.Sprint(n)]))
		gl = append(gl, fmt.Sprint(n))
	}
	var b bytes.Buffer
	err := profileTemplate.Execute(&b, map[string]any{
		"When": time.Now().UTC().Format(time.RFC3339), "Args": " " + strings.Join(args, " "), "Preset": preset,
		"CPUs": c.CPUs, "Threads": c.Threads, "Ranks": c.Ranks, "IOMode": c.IOMode, "Tokens": f.tokens,
		"Disk": g(c.DiskGBps), "KDA": g(c.ComputeFit.Rates.KDA), "MLA": g(c.ComputeFit.Rates.MLA), "Attn": g(c.ComputeFit.Rates.MLAAttention),
		"ReadLat": g(c.ReadLatencyMS), "PassMS": fmt.Sprintf("%.1f", c.PassS*1e3), "PassBytes": report.Bytes(c.PassBytes), "MoE": g(c.ComputeFit.Rates.MoE),
		"Dense": g(c.ComputeFit.Rates.Dense), "Overhead": g(c.ComputeFit.OverheadMS), "Residual": fmt.Sprintf("%.0f%%", 100*c.ComputeFit.Residual),
		"Budget": f.budget, "GroupPrefill": strings.Join(gp, ", "), "GroupLengths": strings.Join(gl, ", "), "Chunk": groupChunk,
		"GKDA": g(c.GroupRates.KDA), "GMLA": g(c.GroupRates.MLA), "GAttn": g(c.GroupRates.MLAAttention), "GMoE": g(c.GroupRates.MoE), "GDense": g(c.GroupRates.Dense), "GroupErr": fmt.Sprintf("%.0f%%", 100*c.GroupPrefillWorstE),
		"GroupOverhead": g(c.GroupOverheadMS), "Step": g(c.DecodeStepMS), "Link": g(c.LinkGBps), "LinkBytes": report.Bytes(c.LinkBytes),
		"RTT": g(c.LinkRTTUS), "Model": c.Model, "Go": runtime.Version(),
	})
	return b.Bytes(), err
}
