package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/internal/machine"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

func init() {
	register(command{name: "model", short: "CPU backend prefill/decode speed on a checkpoint, next to this machine's limits", run: runModelBench})
}

// modelBenchResult is one thread count's figures.
type modelBenchResult struct {
	Threads          int     `json:"threads"`
	PrefillTokens    int     `json:"prefill_tokens"`
	PrefillS         float64 `json:"prefill_s"`
	PrefillTokPerS   float64 `json:"prefill_tok_per_s"`
	PrefillGFLOPS    float64 `json:"prefill_linear_gflops"`
	PeakGFLOPS       float64 `json:"peak_gflops"`
	PeakKind         string  `json:"peak_kind"`
	DecodeSteps      int     `json:"decode_steps"`
	DecodeTokPerS    float64 `json:"decode_tok_per_s"`
	DecodeWeightGBPS float64 `json:"decode_weight_gbps"`
	MemReadGBPS      float64 `json:"mem_read_gbps"`
}

func runModelBench(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("model", pflag.ContinueOnError)
	dir := fs.String("model", "", "checkpoint directory (required)")
	promptLen := fs.Int("prompt-len", 128, "prefill prompt length in tokens")
	steps := fs.Int("decode-steps", 16, "decode steps to time")
	threadList := fs.String("threads", "1,2", "comma-separated thread counts to measure")
	asJSON := fs.Bool("json", false, "print one JSON object as the last line")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench model --model DIR [--prompt-len L] [--decode-steps N] [--threads 1,2] [--json]

Times the CPU reference backend on a checkpoint: prefill of one prompt and single-sequence
decode steps, per thread count. Next to each figure it measures this machine's limit in
the same run: the fp64 fused multiply-add peak of the cores used (AVX2 vector FMAs on amd64,
NEON FMLAs on arm64, scalar FMAs elsewhere, as the report names it), which bounds the prefill GEMMs, and the
sequential memory read bandwidth, which bounds decode (every active weight is read once per
token).

`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		fs.Usage()
		return errors.New("--model is required")
	}
	var threads []int
	for _, f := range strings.Split(*threadList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("--threads: %q is not a positive integer", f)
		}
		threads = append(threads, n)
	}
	var results []modelBenchResult
	for _, n := range threads {
		r, err := benchModelThreads(ctx, *dir, n, *promptLen, *steps)
		if err != nil {
			return err
		}
		results = append(results, r)
		fmt.Printf("threads %d (%s kernels): prefill %d tok in %.2fs = %.1f tok/s, %.2f GFLOP/s linear (%s peak %.2f, %.0f%%); decode %.2f tok/s, %.2f GB/s of weights (memory read %.2f GB/s, %.0f%%)\n",
			n, cpu.KernelName(), r.PrefillTokens, r.PrefillS, r.PrefillTokPerS, r.PrefillGFLOPS, r.PeakKind, r.PeakGFLOPS, 100*r.PrefillGFLOPS/r.PeakGFLOPS,
			r.DecodeTokPerS, r.DecodeWeightGBPS, r.MemReadGBPS, 100*r.DecodeWeightGBPS/r.MemReadGBPS)
	}
	if *asJSON {
		b, _ := json.Marshal(map[string]any{"model": *dir, "goarch": runtime.GOARCH, "cpus": runtime.NumCPU(),
			"kernels": cpu.KernelName(), "results": results})
		fmt.Println(string(b))
	}
	return nil
}

func benchModelThreads(ctx context.Context, dir string, threads, promptLen, steps int) (modelBenchResult, error) {
	r := modelBenchResult{Threads: threads, PrefillTokens: promptLen, DecodeSteps: steps}
	m, err := model.Load(dir, cpu.New(threads), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		return r, err
	}
	defer m.Close()
	prompt := make([]int32, promptLen)
	for i := range prompt {
		prompt[i] = int32((i*7919 + 13) % m.Cfg.VocabSize)
	}
	// Warm the page cache and the code paths with a short run.
	if _, err := m.Generate(ctx, prompt[:min(8, promptLen)], 2); err != nil {
		return r, err
	}
	r.PeakGFLOPS = machine.FMAGFLOPS(threads)
	r.PeakKind = machine.FMAKind()
	r.MemReadGBPS = machine.MemReadGBPS(threads)

	s := m.NewState(0, m.Cfg.NumLayers)
	start := time.Now()
	if err := m.PrefillState(ctx, []*model.SeqState{s}, [][]int32{prompt}); err != nil {
		return r, err
	}
	r.PrefillS = time.Since(start).Seconds()
	r.PrefillTokPerS = float64(promptLen) / r.PrefillS
	r.PrefillGFLOPS = 2 * float64(activeElems(m.Model, true)) * float64(promptLen) / r.PrefillS / 1e9

	next := prompt[len(prompt)-1]
	start = time.Now()
	for i := 0; i < steps; i++ {
		logits, err := m.Decode(ctx, []*model.SeqState{s}, []int32{next})
		if err != nil {
			return r, err
		}
		next = int32(model.Argmax(logits[0]))
	}
	el := time.Since(start).Seconds()
	r.DecodeTokPerS = float64(steps) / el
	r.DecodeWeightGBPS = float64(activeBytes(m.Model)) * float64(steps) / el / 1e9
	return r, nil
}

// activeMatrices lists the matrices one token uses: every trunk matrix, the
// shared experts, top-k routed experts per MoE layer (counted as k times
// the first expert's size: all experts have one shape) and the lm_head.
func activeMatrices(m *model.Model, f func(w *kernels.Matrix, times int)) {
	for _, l := range m.Layers {
		for _, w := range l.Matrices() {
			if l.MoE != nil && isExpert(l.MoE.Experts, w) {
				continue
			}
			f(w, 1)
		}
		if l.MoE != nil {
			e := l.MoE.Experts[0]
			for _, w := range []*kernels.Matrix{e.W1, e.W3, e.W2} {
				f(w, m.Cfg.TopK)
			}
		}
	}
	f(m.Globals.LMHead, 1)
}

func isExpert(experts []kernels.Expert, w *kernels.Matrix) bool {
	for _, e := range experts {
		if e.W1 == w || e.W2 == w || e.W3 == w {
			return true
		}
	}
	return false
}

// activeElems counts multiply-adds per token in the linear layers
// (excluding the lm_head in prefill, which runs on one row).
func activeElems(m *model.Model, prefill bool) int64 {
	var n int64
	activeMatrices(m, func(w *kernels.Matrix, times int) {
		if prefill && w == m.Globals.LMHead {
			return
		}
		n += int64(w.Rows) * int64(w.Cols) * int64(times)
	})
	return n
}

// activeBytes is the weight bytes one decode token reads.
func activeBytes(m *model.Model) int64 {
	var n int64
	activeMatrices(m, func(w *kernels.Matrix, times int) { n += int64(w.Bytes()) * int64(times) })
	return n
}
