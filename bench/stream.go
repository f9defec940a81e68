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
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/rss"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

func init() {
	register(command{name: "stream", short: "benchmark layer-streamed prefill passes: raw read, read-only, compute-only, batched pass, peak RSS, exactness", run: stages(parseStreamFlags, runStream)})
}

// streamRefEnv makes a re-executed bench compute the reference states
// instead of benchmarking (so that the reference's resident model does not
// count in the benchmark's peak RSS).
const streamRefEnv = "TANDEM_BENCH_STREAM_REF"

// streamConfig is bench stream's configuration, from its flags.
type streamConfig struct {
	model, budget, io, readSize, cache string
	promptLen, prompts, depth, threads int
	readers                            int
	seed, reps                         int
	jsonOut, check, single, passOnly   bool
	refOut                             string
	args                               []string // the command line, for the reference child
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

// parseStreamFlags parses bench stream's command line. After --help it
// returns pflag.ErrHelp.
func parseStreamFlags(args []string) (streamConfig, error) {
	fs := pflag.NewFlagSet("stream", pflag.ContinueOnError)
	f := streamConfig{args: args}
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
	return f, parseFlags(fs, args)
}

// validate checks the flags on their own; the checkpoint is opened by the
// run.
func (f streamConfig) validate() error {
	if f.model == "" {
		return errors.New("--model is required: the checkpoint directory to stream (bench mkmodel writes one)")
	}
	if f.reps < 1 {
		return fmt.Errorf("--reps %d: want at least 1", f.reps)
	}
	if f.promptLen < 2 || f.prompts < 1 {
		return fmt.Errorf("--prompt-len %d --prompts %d: want a prompt of at least 2 tokens and at least one prompt", f.promptLen, f.prompts)
	}
	if f.cache != "bf16" && f.cache != "f32" {
		return fmt.Errorf("--cache-dtype %q: want bf16 or f32", f.cache)
	}
	if _, err := config.ParseBytes(f.budget); err != nil {
		return fmt.Errorf("--memory-budget: %w", err)
	}
	if _, err := config.ParseBytes(f.readSize); err != nil {
		return fmt.Errorf("--read-size: %w", err)
	}
	if _, err := streamer.ParseIOMode(f.io); err != nil {
		return fmt.Errorf("--io: %w", err)
	}
	return nil
}

// latent is the MLA cache dtype of --cache-dtype.
func (f streamConfig) latent() model.DType {
	if f.cache == "f32" {
		return model.F32
	}
	return model.BF16
}

// streamSay logs a line of bench stream's progress to stderr.
func streamSay(format string, a ...any) { fmt.Fprintf(os.Stderr, "bench stream: "+format+"\n", a...) }

func runStream(ctx context.Context, f streamConfig) error {
	if out := os.Getenv(streamRefEnv); out != "" {
		return streamReference(ctx, f, f.latent(), out)
	}
	b, err := startStreamBench(f)
	if err != nil {
		return err
	}
	defer b.w.Close()
	if f.passOnly {
		return streamPassOnly(ctx, f, b.w, b.prompts, b.plan, b.budget, f.latent())
	}
	if err := b.serialRawRead(ctx); err != nil {
		return err
	}
	if b.dir, err = os.MkdirTemp("", "bench-stream-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.dir)
	for r := range f.reps {
		if err := b.round(ctx, r); err != nil {
			return err
		}
	}
	if b.rep.PassSingleS > 0 {
		b.rep.BatchRatio = b.rep.PassS / b.rep.PassSingleS
	}
	// The raw read again, now that every phase has touched the files, so
	// that cache or device warm-up never flatters the pass.
	if b.rep.RawReadEndGBps, err = b.rawRead(ctx, "raw read again"); err != nil {
		return err
	}
	if p, err := rss.Peak(); err == nil {
		b.rep.PeakRSSBytes = p
	}
	b.w.Close()
	if f.check { // 6. Exactness, against the model core in a child process.
		match, err := streamCheck(ctx, f.args, b.dir, f.reps, len(b.prompts))
		if err != nil {
			return fmt.Errorf("reference: %w", err)
		}
		b.rep.StatesMatch, b.rep.StatesChecked = match, true
		streamSay("states match the model core: %v", match)
	}
	return b.finish()
}

// streamBench is one bench stream run: the worker, its prompts and plan,
// and the report being filled in.
type streamBench struct {
	f       streamConfig
	w       *worker.Worker
	st      *streamer.Streamer
	budget  int64
	prompts [][]int32
	plan    planner.Plan
	reports []scheduler.PassReport // the passes since the last reset
	dir     string                 // the passes' state files
	rep     streamReport
}

// startStreamBench starts the worker of f and plans the batched pass. The
// caller closes b.w.
func startStreamBench(f streamConfig) (*streamBench, error) {
	b := &streamBench{f: f}
	var err error
	if b.budget, err = config.ParseBytes(f.budget); err != nil {
		return nil, err
	}
	readSize, err := config.ParseBytes(f.readSize)
	if err != nil {
		return nil, err
	}
	iomode, err := streamer.ParseIOMode(f.io)
	if err != nil {
		return nil, err
	}
	debug.SetMemoryLimit(b.budget) // as the worker binary does
	logger, err := config.NewLogger("info", "console", os.Stderr)
	if err != nil {
		return nil, err
	}
	b.w, err = worker.New(worker.Config{Model: f.model, Budget: b.budget, Depth: f.depth, Threads: f.threads, LatentDType: f.latent(),
		ReadSize: readSize, Readers: f.readers, IO: iomode, Log: logger,
		OnPass: func(r scheduler.PassReport) { b.reports = append(b.reports, r) }})
	if err != nil {
		return nil, err
	}
	b.st = b.w.Streamer()
	b.prompts = streamPrompts(f, b.w.Model().VocabSize)
	b.rep = streamReport{Model: f.model, Layers: b.w.Model().NumLayers, WeightsBytes: b.st.Layout().TensorBytes, IOMode: b.st.IOName(),
		MemBudgetBytes: b.budget, Depth: b.w.Depth(), Threads: b.w.Executor().Model.Backend.Threads(), Prompts: f.prompts, PromptLen: f.promptLen,
		ReadSizeBytes: readSize, Readers: b.st.Readers()}
	if !b.st.Direct() {
		b.rep.PageCacheNote = "direct I/O unavailable: reads go through the page cache, so rates may reflect cached data rather than the disk"
	}
	lens := make([]int, len(b.prompts))
	for i, p := range b.prompts {
		lens[i] = len(p) - 1
	}
	if b.plan, err = b.w.Plan(lens); err != nil {
		b.w.Close()
		return nil, err
	}
	b.rep.Tile, b.rep.Plan = b.plan.Tile, b.plan.String()
	streamSay("%s: %d layers, %s of weights, io %s, budget %s, depth %d; plan: %s", f.model, b.rep.Layers,
		progress.HumanBytes(b.rep.WeightsBytes), b.rep.IOMode, progress.HumanBytes(b.budget), b.rep.Depth, b.plan)
	return b, nil
}

// serialRawRead times the raw sequential read one request at a time
// (dd-like).
func (b *streamBench) serialRawRead(ctx context.Context) error {
	n, d, err := b.st.RawRead(ctx, 1)
	if err != nil {
		return fmt.Errorf("raw read: %w", err)
	}
	b.rep.RawReadSerialGBps = float64(n) / d.Seconds() / 1e9
	streamSay("raw read, 1 request in flight: %s in %.2fs = %.3f GB/s", progress.HumanBytes(n), d.Seconds(), b.rep.RawReadSerialGBps)
	return nil
}

// rawRead times one raw read with as many requests in flight as the
// streamer keeps, keeps the best so far and returns its rate.
func (b *streamBench) rawRead(ctx context.Context, what string) (float64, error) {
	n, d, err := b.st.RawRead(ctx, b.st.Readers())
	if err != nil {
		return 0, fmt.Errorf("raw read: %w", err)
	}
	gbps := float64(n) / d.Seconds() / 1e9
	if gbps > b.rep.RawReadGBps {
		b.rep.RawReadBytes, b.rep.RawReadS, b.rep.RawReadGBps = n, d.Seconds(), gbps
	}
	streamSay("%s, %d requests in flight: %s in %.2fs = %.3f GB/s", what, b.st.Readers(), progress.HumanBytes(n), d.Seconds(), gbps)
	return gbps, nil
}

// round runs round r of the timed phases, keeping the best of each.
func (b *streamBench) round(ctx context.Context, r int) error {
	streamSay("round %d of %d", r+1, b.f.reps)
	// 1. Raw sequential reads with as many requests in flight as the
	// streamer keeps: the baseline a pass is held to.
	gbps, err := b.rawRead(ctx, "raw read")
	if err != nil {
		return err
	}
	if r == 0 {
		b.rep.RawReadStartGBps = gbps
	}
	// 2. Read-only pass through the ring.
	if err := b.readOnly(ctx); err != nil {
		return err
	}
	// 3. Serial pass at depth 0: compute with no read in flight.
	cs, err := serialPass(ctx, b.w, b.prompts, b.plan.Tile)
	if err != nil {
		return fmt.Errorf("serial pass: %w", err)
	}
	streamSay("serial pass (depth 0): %.2fs, of which compute %.2fs", cs.Wall.Seconds(), cs.Compute.Seconds())
	if b.rep.ComputeOnlyS == 0 || cs.Compute.Seconds() < b.rep.ComputeOnlyS {
		b.rep.ComputeOnlyS = cs.Compute.Seconds()
	}
	// 4. The batched pass through the scheduler.
	if err := b.batched(ctx, r); err != nil {
		return err
	}
	// 5. One prompt alone.
	if b.f.single && b.f.prompts > 1 {
		return b.single(ctx, r)
	}
	return nil
}

// readOnly times a pass through the prefetch ring with nothing computed.
func (b *streamBench) readOnly(ctx context.Context) error {
	ro, bytesRO, err := readOnlyPass(ctx, b.st, b.w.Depth())
	if err != nil {
		return fmt.Errorf("read-only pass: %w", err)
	}
	streamSay("read-only pass: %.2fs = %.3f GB/s", ro.Seconds(), float64(bytesRO)/ro.Seconds()/1e9)
	if b.rep.ReadOnlyS == 0 || ro.Seconds() < b.rep.ReadOnlyS {
		b.rep.ReadOnlyS, b.rep.ReadOnlyGBps = ro.Seconds(), float64(bytesRO)/ro.Seconds()/1e9
	}
	return nil
}

// batched times the batched pass of round r through the scheduler, its
// states written under dir/pass<r>.
func (b *streamBench) batched(ctx context.Context, r int) error {
	b.reports = b.reports[:0]
	if err := submitAndWait(ctx, b.w, b.prompts, filepath.Join(b.dir, fmt.Sprintf("pass%d", r))); err != nil {
		return fmt.Errorf("batched pass: %w", err)
	}
	var wall, compute, wait float64
	var bytesPass int64
	for _, pr := range b.reports {
		wall += pr.Stats.Wall.Seconds()
		compute += pr.Stats.Compute.Seconds()
		wait += pr.Stats.ReadWait.Seconds()
		bytesPass += pr.Stats.Bytes
	}
	streamSay("batched pass: %d prompts x %d tokens in %d pass(es): %.2fs, %.3f GB/s, compute %.2fs, waited on reads %.2fs",
		b.f.prompts, b.f.promptLen, len(b.reports), wall, float64(bytesPass)/wall/1e9, compute, wait)
	if b.rep.PassS == 0 || wall < b.rep.PassS {
		b.rep.PassS, b.rep.PassComputeS, b.rep.PassReadWaitS = wall, compute, wait
		b.rep.Passes = len(b.reports)
		b.rep.PassReadGBps = float64(bytesPass) / wall / 1e9
	}
	return nil
}

// single times round r's pass of the first prompt alone.
func (b *streamBench) single(ctx context.Context, r int) error {
	b.reports = b.reports[:0]
	if err := submitAndWait(ctx, b.w, b.prompts[:1], filepath.Join(b.dir, fmt.Sprintf("single%d", r))); err != nil {
		return fmt.Errorf("single-prompt pass: %w", err)
	}
	var single float64
	for _, pr := range b.reports {
		single += pr.Stats.Wall.Seconds()
	}
	streamSay("single-prompt pass: %.2fs", single)
	if b.rep.PassSingleS == 0 || single < b.rep.PassSingleS {
		b.rep.PassSingleS = single
	}
	return nil
}

// finish derives the ratios and targets, prints the report (one line with
// --json, indented otherwise) and fails if the states were checked and
// differ.
func (b *streamBench) finish() error {
	rep := &b.rep
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
	streamSay("peak RSS %s of a %s budget; pass/max(read-only, compute-only) = %.2f; pass read/raw read = %.2f",
		progress.HumanBytes(rep.PeakRSSBytes), progress.HumanBytes(b.budget), rep.OverlapRatio, rep.ReadRatio)
	if b.f.jsonOut {
		if err := printJSON(rep); err != nil {
			return err
		}
	} else {
		out, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Println(string(out))
	}
	if b.f.check && !rep.StatesMatch {
		return errors.New("streamed states differ from the model core's")
	}
	return nil
}

// streamPrompts are the benchmark's prompts: deterministic ids per seed.
func streamPrompts(f streamConfig, vocab int) [][]int32 {
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
func streamReference(ctx context.Context, f streamConfig, latent model.DType, out string) error {
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
