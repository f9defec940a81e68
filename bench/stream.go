package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/executor"
	"github.com/tandem-inference/tandem/prefill-worker/rss"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

func init() {
	register(command{name: "stream", short: "benchmark layer-streamed prefill passes: raw read, read-only, compute-only, batched pass, peak RSS, exactness", run: runStream})
}

// streamRefEnv makes a re-executed bench compute the reference states
// instead of benchmarking (so that the reference's resident model does not
// count in the benchmark's peak RSS).
const streamRefEnv = "TANDEM_BENCH_STREAM_REF"

type streamFlags struct {
	model, budget, io, readSize, cache string
	promptLen, prompts, depth, threads int
	readers                            int
	seed, reps                         int
	jsonOut, check, single, passOnly   bool
	refOut                             string
}

// streamReport is the benchmark's result; the JSON object is the last line
// of stdout.
type streamReport struct {
	Model          string  `json:"model"`
	Layers         int     `json:"layers"`
	WeightsBytes   int64   `json:"weights_bytes"`
	IOMode         string  `json:"io_mode"`
	PageCacheNote  string  `json:"page_cache_note,omitempty"`
	MemBudgetBytes int64   `json:"mem_budget_bytes"`
	Depth          int     `json:"depth"`
	Tile           int     `json:"tile"`
	Threads        int     `json:"threads"`
	Prompts        int     `json:"prompts"`
	PromptLen      int     `json:"prompt_len"`
	Passes         int     `json:"passes"`
	Plan           string  `json:"plan"`
	RawReadBytes   int64   `json:"raw_read_bytes"`
	RawReadS       float64 `json:"raw_read_s"`
	RawReadGBps    float64 `json:"raw_read_gbps"`
	// RawReadGBps is the better of RawReadStartGBps and RawReadEndGBps: the
	// raw read (streamer's concurrency) before and after the passes.
	RawReadStartGBps float64 `json:"raw_read_start_gbps"`
	RawReadEndGBps   float64 `json:"raw_read_end_gbps"`
	// RawReadSerialGBps is the same read one request at a time.
	RawReadSerialGBps float64 `json:"raw_read_serial_gbps"`
	ReadSizeBytes     int64   `json:"read_size_bytes"`
	Readers           int     `json:"readers"`
	ReadOnlyS         float64 `json:"read_only_s"`
	ReadOnlyGBps      float64 `json:"read_only_gbps"`
	ComputeOnlyS      float64 `json:"compute_only_s"`
	PassS             float64 `json:"pass_s"`
	PassReadGBps      float64 `json:"pass_read_gbps"`
	PassComputeS      float64 `json:"pass_compute_s"`
	PassReadWaitS     float64 `json:"pass_read_wait_s"`
	PassSingleS       float64 `json:"pass_single_s,omitempty"`
	BatchRatio        float64 `json:"batch_ratio,omitempty"`
	IOBound           bool    `json:"io_bound"`
	OverlapRatio      float64 `json:"overlap_ratio"`
	ReadRatio         float64 `json:"pass_read_ratio"`
	PeakRSSBytes      int64   `json:"peak_rss_bytes"`
	StatesMatch       bool    `json:"states_match"`
	StatesChecked     bool    `json:"states_checked"`
	// Targets of the issue; the read-rate and batching targets apply only
	// to I/O-bound passes and are null otherwise.
	Targets struct {
		PassReadGE09Raw *bool `json:"pass_read_ge_0_9_raw"`
		PassLE115Max    bool  `json:"pass_le_1_15_max"`
		BatchLE13       *bool `json:"batch_le_1_3"`
	} `json:"targets"`
}

func runStream(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("stream", pflag.ContinueOnError)
	var f streamFlags
	fs.StringVar(&f.model, "model", "", "checkpoint directory (required)")
	fs.StringVar(&f.budget, "memory-budget", "4GiB", "memory budget of the worker, a byte size: 512MiB")
	config.Alias(fs, "mem-budget", "memory-budget")
	fs.IntVar(&f.promptLen, "prompt-len", 64, "tokens per prompt (the worker prefills all but the last)")
	fs.IntVar(&f.prompts, "prompts", 4, "prompts in the batched pass")
	fs.IntVar(&f.depth, "depth", -1, "prefetch depth (-1: the planner's choice)")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads (0: all)")
	fs.IntVar(&f.seed, "seed", 1, "prompt token seed")
	fs.IntVar(&f.reps, "reps", 3, "rounds of the timed phases; each figure is the best of its rounds")
	fs.StringVar(&f.io, "io", "auto", "I/O mode: auto, direct or buffered")
	fs.StringVar(&f.readSize, "read-size", "8MiB", "bytes per read request")
	fs.IntVar(&f.readers, "readers", streamer.DefaultReaders, "read requests in flight")
	fs.StringVar(&f.cache, "cache-dtype", "bf16", "MLA cache dtype: bf16 or f32")
	fs.BoolVar(&f.jsonOut, "json", false, "print the report as one JSON object on the last line")
	fs.BoolVar(&f.check, "check", true, "compare every state with the in-memory model core's prefill (in a child process)")
	fs.BoolVar(&f.single, "single", true, "also time a pass with the first prompt alone (batch_ratio)")
	fs.BoolVar(&f.passOnly, "pass-only", false, "run the batched pass once and nothing else; check every layer's state for its size and finite values, then drop it (for models larger than memory and disk: bench mkmodel --sparse)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench stream --model DIR --memory-budget B --prompt-len L --prompts K [--json] [--pass-only]

Times layer-streamed prefill on one worker, in this order: raw sequential reads
of every layer's bytes (same files, same I/O mode and request size; one request
at a time: raw_read_serial_gbps, then as many in flight as the streamer keeps:
raw_read_gbps, the baseline for pass_read_gbps); a read-only pass through the
prefetch ring; a serial pass at depth 0 (compute time with no reads in flight:
compute_only_s); the batched pass of K prompts through the scheduler at the
planned depth (pass_s); a pass with one prompt (batch_ratio = pass_s /
pass_single_s). The phases after the serial raw read run --reps rounds, and
a last raw read closes the run; every figure is the best of its rounds, the
limits and the pass alike, so that another process's burst on a shared
machine neither flatters nor sinks a ratio. Then a child process prefills
each prompt on the in-memory model core and the states of every round are
compared byte for byte.
peak_rss_bytes is this process's peak (the reference runs elsewhere).

With --pass-only it runs the batched pass once and nothing else, each
state going to a sink that checks every layer's parts against the sizes
the config implies and that every value is finite, then drops it: the mode
for a model larger than memory and disk, such as bench mkmodel --preset k3
--sparse (every weight zero, held in holes).

`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if f.model == "" {
		fs.Usage()
		return errors.New("--model is required")
	}
	if f.reps < 1 {
		return fmt.Errorf("--reps %d: want at least 1", f.reps)
	}
	if f.promptLen < 2 || f.prompts < 1 {
		return fmt.Errorf("--prompt-len %d --prompts %d: want a prompt of at least 2 tokens and at least one prompt", f.promptLen, f.prompts)
	}
	latent := model.BF16
	switch f.cache {
	case "bf16":
	case "f32":
		latent = model.F32
	default:
		return fmt.Errorf("--cache-dtype %q: want bf16 or f32", f.cache)
	}
	if out := os.Getenv(streamRefEnv); out != "" {
		return streamReference(ctx, f, latent, out)
	}
	budget, err := config.ParseBytes(f.budget)
	if err != nil {
		return err
	}
	readSize, err := config.ParseBytes(f.readSize)
	if err != nil {
		return err
	}
	iomode, err := streamer.ParseIOMode(f.io)
	if err != nil {
		return err
	}
	debug.SetMemoryLimit(budget) // as the worker binary does
	logger, err := config.NewLogger("info", "console", os.Stderr)
	if err != nil {
		return err
	}
	var reports []scheduler.PassReport
	w, err := worker.New(worker.Config{Model: f.model, Budget: budget, Depth: f.depth, Threads: f.threads, LatentDType: latent,
		ReadSize: readSize, Readers: f.readers, IO: iomode, Log: logger,
		OnPass: func(r scheduler.PassReport) { reports = append(reports, r) }})
	if err != nil {
		return err
	}
	defer w.Close()
	st := w.Streamer()
	prompts := streamPrompts(f, w.Model().VocabSize)
	rep := streamReport{Model: f.model, Layers: w.Model().NumLayers, WeightsBytes: st.Layout().TensorBytes, IOMode: st.IOName(),
		MemBudgetBytes: budget, Depth: w.Depth(), Threads: w.Executor().Model.Backend.Threads(), Prompts: f.prompts, PromptLen: f.promptLen,
		ReadSizeBytes: readSize, Readers: st.Readers()}
	if !st.Direct() {
		rep.PageCacheNote = "direct I/O unavailable: reads go through the page cache, so rates may reflect cached data rather than the disk"
	}
	lens := make([]int, len(prompts))
	for i, p := range prompts {
		lens[i] = len(p) - 1
	}
	plan, err := w.Plan(lens)
	if err != nil {
		return err
	}
	rep.Tile, rep.Plan = plan.Tile, plan.String()
	say := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "bench stream: "+format+"\n", a...) }
	say("%s: %d layers, %s of weights, io %s, budget %s, depth %d; plan: %s", f.model, rep.Layers,
		progress.HumanBytes(rep.WeightsBytes), rep.IOMode, progress.HumanBytes(budget), rep.Depth, plan)
	if f.passOnly {
		return streamPassOnly(ctx, f, w, prompts, plan, budget, latent)
	}

	// 1. Raw sequential reads: one request at a time (dd-like), then with as
	// many in flight as the streamer keeps (the baseline a pass is held to).
	n, d, err := st.RawRead(ctx, 1)
	if err != nil {
		return fmt.Errorf("raw read: %w", err)
	}
	rep.RawReadSerialGBps = float64(n) / d.Seconds() / 1e9
	say("raw read, 1 request in flight: %s in %.2fs = %.3f GB/s", progress.HumanBytes(n), d.Seconds(), rep.RawReadSerialGBps)
	dir, err := os.MkdirTemp("", "bench-stream-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// rawRead times one parallel raw read and keeps the best so far.
	rawRead := func(what string) (float64, error) {
		n, d, err := st.RawRead(ctx, st.Readers())
		if err != nil {
			return 0, fmt.Errorf("raw read: %w", err)
		}
		gbps := float64(n) / d.Seconds() / 1e9
		if gbps > rep.RawReadGBps {
			rep.RawReadBytes, rep.RawReadS, rep.RawReadGBps = n, d.Seconds(), gbps
		}
		say("%s, %d requests in flight: %s in %.2fs = %.3f GB/s", what, st.Readers(), progress.HumanBytes(n), d.Seconds(), gbps)
		return gbps, nil
	}
	for r := range f.reps {
		say("round %d of %d", r+1, f.reps)
		// 1. Raw sequential reads with as many requests in flight as the
		// streamer keeps: the baseline a pass is held to.
		gbps, err := rawRead("raw read")
		if err != nil {
			return err
		}
		if r == 0 {
			rep.RawReadStartGBps = gbps
		}

		// 2. Read-only pass through the ring.
		ro, bytesRO, err := readOnlyPass(ctx, st, w.Depth())
		if err != nil {
			return fmt.Errorf("read-only pass: %w", err)
		}
		say("read-only pass: %.2fs = %.3f GB/s", ro.Seconds(), float64(bytesRO)/ro.Seconds()/1e9)
		if rep.ReadOnlyS == 0 || ro.Seconds() < rep.ReadOnlyS {
			rep.ReadOnlyS, rep.ReadOnlyGBps = ro.Seconds(), float64(bytesRO)/ro.Seconds()/1e9
		}

		// 3. Serial pass at depth 0: compute with no read in flight.
		cs, err := serialPass(ctx, w, prompts, plan.Tile)
		if err != nil {
			return fmt.Errorf("serial pass: %w", err)
		}
		say("serial pass (depth 0): %.2fs, of which compute %.2fs", cs.Wall.Seconds(), cs.Compute.Seconds())
		if rep.ComputeOnlyS == 0 || cs.Compute.Seconds() < rep.ComputeOnlyS {
			rep.ComputeOnlyS = cs.Compute.Seconds()
		}

		// 4. The batched pass through the scheduler.
		reports = reports[:0]
		if err := submitAndWait(ctx, w, prompts, filepath.Join(dir, fmt.Sprintf("pass%d", r))); err != nil {
			return fmt.Errorf("batched pass: %w", err)
		}
		var wall, compute, wait float64
		var bytesPass int64
		for _, pr := range reports {
			wall += pr.Stats.Wall.Seconds()
			compute += pr.Stats.Compute.Seconds()
			wait += pr.Stats.ReadWait.Seconds()
			bytesPass += pr.Stats.Bytes
		}
		say("batched pass: %d prompts x %d tokens in %d pass(es): %.2fs, %.3f GB/s, compute %.2fs, waited on reads %.2fs",
			f.prompts, f.promptLen, len(reports), wall, float64(bytesPass)/wall/1e9, compute, wait)
		if rep.PassS == 0 || wall < rep.PassS {
			rep.PassS, rep.PassComputeS, rep.PassReadWaitS = wall, compute, wait
			rep.Passes = len(reports)
			rep.PassReadGBps = float64(bytesPass) / wall / 1e9
		}

		// 5. One prompt alone.
		if f.single && f.prompts > 1 {
			reports = reports[:0]
			if err := submitAndWait(ctx, w, prompts[:1], filepath.Join(dir, fmt.Sprintf("single%d", r))); err != nil {
				return fmt.Errorf("single-prompt pass: %w", err)
			}
			var single float64
			for _, pr := range reports {
				single += pr.Stats.Wall.Seconds()
			}
			say("single-prompt pass: %.2fs", single)
			if rep.PassSingleS == 0 || single < rep.PassSingleS {
				rep.PassSingleS = single
			}
		}
	}
	if rep.PassSingleS > 0 {
		rep.BatchRatio = rep.PassS / rep.PassSingleS
	}
	// The raw read again, now that every phase has touched the files, so
	// that cache or device warm-up never flatters the pass.
	if rep.RawReadEndGBps, err = rawRead("raw read again"); err != nil {
		return err
	}
	if p, err := rss.Peak(); err == nil {
		rep.PeakRSSBytes = p
	}
	w.Close()

	// 6. Exactness, against the model core in a child process.
	if f.check {
		match, err := streamCheck(ctx, args, dir, f.reps, len(prompts))
		if err != nil {
			return fmt.Errorf("reference: %w", err)
		}
		rep.StatesMatch, rep.StatesChecked = match, true
		say("states match the model core: %v", match)
	}

	rep.IOBound = rep.ReadOnlyS >= rep.ComputeOnlyS
	floor := max(rep.ReadOnlyS, rep.ComputeOnlyS)
	rep.OverlapRatio = rep.PassS / floor
	rep.ReadRatio = rep.PassReadGBps / rep.RawReadGBps
	rep.Targets.PassLE115Max = rep.OverlapRatio <= 1.15
	if rep.IOBound {
		ok := rep.ReadRatio >= 0.9
		rep.Targets.PassReadGE09Raw = &ok
		if rep.BatchRatio > 0 {
			ok := rep.BatchRatio <= 1.3
			rep.Targets.BatchLE13 = &ok
		}
	}
	say("peak RSS %s of a %s budget; pass/max(read-only, compute-only) = %.2f; pass read/raw read = %.2f",
		progress.HumanBytes(rep.PeakRSSBytes), progress.HumanBytes(budget), rep.OverlapRatio, rep.ReadRatio)
	if f.jsonOut {
		b, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		fmt.Println(string(b))
	} else {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Println(string(b))
	}
	if f.check && !rep.StatesMatch {
		return errors.New("streamed states differ from the model core's")
	}
	return nil
}

// streamPrompts are the benchmark's prompts: deterministic ids per seed.
func streamPrompts(f streamFlags, vocab int) [][]int32 {
	out := make([][]int32, f.prompts)
	for k := range out {
		p := make([]int32, f.promptLen)
		for i := range p {
			p[i] = int32((i*7919 + f.seed*104729 + k*15485863 + 13) % vocab)
		}
		out[k] = p
	}
	return out
}

// readOnlyPass streams every layer through the ring with nothing computed.
func readOnlyPass(ctx context.Context, st *streamer.Streamer, depth int) (time.Duration, int64, error) {
	t0 := time.Now()
	p, err := st.Start(ctx, depth)
	if err != nil {
		return 0, 0, err
	}
	defer p.Close()
	for {
		sl, err := p.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, 0, err
		}
		sl.Release()
	}
	d := time.Since(t0)
	return d, p.Stats().Bytes, p.Close()
}

// serialPass runs the prompts through one pass at depth 0 (each layer is
// read, then computed), so its compute time has no reads in flight.
func serialPass(ctx context.Context, w *worker.Worker, prompts [][]int32, tile int) (executor.Stats, error) {
	e := w.Executor()
	c := e.Model.Cfg
	seqs := make([]*executor.Seq, len(prompts))
	for i, p := range prompts {
		toks := p[:len(p)-1]
		seqs[i] = &executor.Seq{ID: fmt.Sprintf("serial%d", i), State: c.NewSeqState(0, c.NumLayers,
			model.StateOptions{LatentDType: e.Model.State.LatentDType, LatentCapacity: len(toks)}), Tokens: toks}
	}
	st, err := e.Run(ctx, seqs, executor.Options{Depth: 0, Tile: tile, Pass: 0})
	if err != nil {
		return st, err
	}
	for _, s := range seqs {
		if s.Err != nil {
			return st, s.Err
		}
	}
	return st, nil
}

// submitAndWait prefills the prompts through the scheduler into state files
// dir/p<i>.k3st.
func submitAndWait(ctx context.Context, w *worker.Worker, prompts [][]int32, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	specs := make([]worker.Spec, len(prompts))
	for i, p := range prompts {
		f, err := sink.NewFile(filepath.Join(dir, fmt.Sprintf("p%d.k3st", i)), w.Model().NumLayers)
		if err != nil {
			return err
		}
		specs[i] = worker.Spec{ID: fmt.Sprintf("%s-p%d", filepath.Base(dir), i), Tokens: p[:len(p)-1], Sink: f}
	}
	jobs, err := w.SubmitAll(specs)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if err := j.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// streamCheck runs this command again in reference mode and compares its
// state files with those of the batched pass of every round.
func streamCheck(ctx context.Context, args []string, dir string, reps, n int) (bool, error) {
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	ref := filepath.Join(dir, "ref")
	if err := os.MkdirAll(ref, 0o755); err != nil {
		return false, err
	}
	cmd := exec.CommandContext(ctx, exe, append([]string{"stream"}, args...)...)
	cmd.Env = append(os.Environ(), streamRefEnv+"="+ref)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return false, err
	}
	match := true
	for i := 0; i < n; i++ {
		b, err := os.ReadFile(filepath.Join(ref, fmt.Sprintf("p%d.k3st", i)))
		if err != nil {
			return false, err
		}
		for r := range reps {
			a, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("pass%d", r), fmt.Sprintf("p%d.k3st", i)))
			if err != nil {
				return false, err
			}
			if !bytes.Equal(a, b) {
				fmt.Fprintf(os.Stderr, "bench stream: round %d, prompt %d: streamed state (%d bytes) differs from the reference (%d bytes)\n", r+1, i, len(a), len(b))
				match = false
			}
		}
	}
	return match, nil
}

// streamReference is the child's side: each prompt[:-1] prefilled alone on
// the in-memory model core, written as state files.
func streamReference(ctx context.Context, f streamFlags, latent model.DType, out string) error {
	m, err := model.Load(f.model, cpu.New(f.threads), model.LoadOptions{Embed: true})
	if err != nil {
		return err
	}
	defer m.Close()
	m.State.LatentDType = latent
	for i, p := range streamPrompts(f, m.Cfg.VocabSize) {
		s := m.NewState(0, m.Cfg.NumLayers)
		if err := m.PrefillState(ctx, []*model.SeqState{s}, [][]int32{p[:len(p)-1]}); err != nil {
			return err
		}
		b, err := s.MarshalBinary()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, fmt.Sprintf("p%d.k3st", i)), b, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench stream: reference state %d of %d written\n", i+1, f.prompts)
	}
	return nil
}
