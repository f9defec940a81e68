package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/rss"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// passOnlyReport is the result of bench stream --pass-only; the JSON object
// is the last line of stdout.
type passOnlyReport struct {
	Model          string `json:"model"`
	Layers         int    `json:"layers"`
	WeightsBytes   int64  `json:"weights_bytes"`
	IOMode         string `json:"io_mode"`
	MemBudgetBytes int64  `json:"mem_budget_bytes"`
	Depth          int    `json:"depth"`
	SlotBytes      int64  `json:"slot_bytes"`
	Threads        int    `json:"threads"`
	Prompts        int    `json:"prompts"`
	PromptLen      int    `json:"prompt_len"`
	Plan           string `json:"plan"`
	// The pass: wall time, bytes read from the checkpoint and their rate,
	// time computing and time waiting for reads.
	Passes        int     `json:"passes"`
	PassS         float64 `json:"pass_s"`
	PassBytes     int64   `json:"pass_bytes"`
	PassReadGBps  float64 `json:"pass_read_gbps"`
	PassComputeS  float64 `json:"pass_compute_s"`
	PassReadWaitS float64 `json:"pass_read_wait_s"`
	PeakRSSBytes  int64   `json:"peak_rss_bytes"`
	WithinBudget  bool    `json:"within_budget"`
	// Every prompt's state, checked layer by layer by a sink.Check: the
	// layers received, each layer kind's state size (one sequence), and a
	// sequence's whole state.
	LayersChecked      int            `json:"layers_checked"`
	LayerStateBytes    map[string]int `json:"layer_state_bytes"`
	SeqStateBytes      int64          `json:"seq_state_bytes"`
	StatesFiniteShaped bool           `json:"states_finite_and_shaped"`
}

// streamPassOnly runs the prompts through one batched pass of the worker
// and nothing else: no raw reads, read-only or serial passes and no
// reference. Each state goes to a sink.Check, which verifies every layer's
// parts against the sizes the config implies and that every value is
// finite, then drops it. It is the mode for a checkpoint larger than memory
// and disk (bench mkmodel --preset k3 --sparse): one pass streams every
// layer once.
func streamPassOnly(ctx context.Context, f streamConfig, w *worker.Worker, prompts [][]int32, plan planner.Plan, budget int64, latent model.DType) error {
	st := w.Streamer()
	cfg := w.Model()
	rep := passOnlyReport{Model: f.model, Layers: cfg.NumLayers, WeightsBytes: st.Layout().TensorBytes, IOMode: st.IOName(),
		MemBudgetBytes: budget, Depth: w.Depth(), SlotBytes: st.Layout().SlotBytes, Threads: w.Executor().Model.Backend.Threads(),
		Prompts: len(prompts), PromptLen: f.promptLen, Plan: plan.String()}
	checks := make([]*sink.Check, len(prompts))
	specs := make([]worker.Spec, len(prompts))
	for i, p := range prompts {
		toks := p[:len(p)-1]
		checks[i] = sink.NewCheck(cfg, len(toks), latent)
		specs[i] = worker.Spec{ID: fmt.Sprintf("pass-p%d", i), Tokens: toks, Sink: checks[i]}
	}
	start := time.Now()
	jobs, err := w.SubmitAll(specs)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if err := j.Wait(ctx); err != nil {
			return fmt.Errorf("pass: %w", err)
		}
	}
	wall := time.Since(start)
	ws := w.Stats()
	rep.Passes = ws.Passes
	rep.PassS, rep.PassBytes = wall.Seconds(), ws.BytesRead
	rep.PassReadGBps = float64(ws.BytesRead) / wall.Seconds() / 1e9
	rep.PassComputeS, rep.PassReadWaitS = ws.ComputeTime.Seconds(), ws.ReadWait.Seconds()
	if p, err := rss.Peak(); err == nil {
		rep.PeakRSSBytes = p
		rep.WithinBudget = p <= budget
	}
	rep.LayerStateBytes = map[string]int{}
	for i, c := range checks {
		sizes, err := c.Sizes()
		if err != nil {
			return fmt.Errorf("prompt %d: %w", i, err)
		}
		for L, n := range sizes {
			rep.LayersChecked++
			if i == 0 {
				rep.LayerStateBytes[cfg.LayerKind(L).String()] = n
				rep.SeqStateBytes += int64(n)
			}
		}
	}
	rep.StatesFiniteShaped = true
	fmt.Fprintf(os.Stderr, "bench stream: one pass of %d prompt(s) x %d tokens through %d layers: %.1fs, %s read at %.2f GB/s (compute %.1fs, waited on reads %.1fs); peak RSS %s of a %s budget; %d layer states checked (%v bytes per layer kind, %s per sequence)\n",
		len(prompts), f.promptLen, cfg.NumLayers, rep.PassS, progress.HumanBytes(rep.PassBytes), rep.PassReadGBps, rep.PassComputeS, rep.PassReadWaitS,
		progress.HumanBytes(rep.PeakRSSBytes), progress.HumanBytes(budget), rep.LayersChecked, rep.LayerStateBytes, progress.HumanBytes(rep.SeqStateBytes))
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	if rep.PeakRSSBytes > budget {
		return fmt.Errorf("peak RSS %s exceeds the %s budget", progress.HumanBytes(rep.PeakRSSBytes), progress.HumanBytes(budget))
	}
	return nil
}
