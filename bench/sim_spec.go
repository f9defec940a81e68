package main

import (
	"fmt"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/bench/sim"
)

// specAcceptance are the per-token acceptance rates the projection shows:
// none, then the range the published figures span. EAGLE-3 drafts for K3
// are reported at 2.4-3.6 accepted tokens per step, and prompt lookup on
// code editing at 2-4x in llama.cpp and vLLM; at k = 4 a rate of 0.7 gives
// 2.8 tokens a step and 0.9 gives 4.1.
var specAcceptance = []float64{0, 0.5, 0.6, 0.7, 0.8, 0.9}

// specKMax is the most tokens the decode group drafts a step.
const specKMax = 4

// simSpec is one acceptance rate's projection for one stream.
type simSpec struct {
	Acceptance    float64 `json:"acceptance"`
	K             int     `json:"k"`
	TokensPerStep float64 `json:"tokens_per_step"`
	StepMS        float64 `json:"step_ms"`
	TokPerS       float64 `json:"tok_s"`
	Speedup       float64 `json:"speedup"`
}

// speculate projects one stream's decode on the decode group with drafts.
func (r *simRun) speculate() {
	for _, p := range sim.ProjectSpec(r.m, r.macs.Decode, specAcceptance, specKMax) {
		r.out.Speculative = append(r.out.Speculative, simSpec{Acceptance: p.Acceptance, K: p.K,
			TokensPerStep: round3(p.TokensPerStep), StepMS: round3(p.StepMS), TokPerS: round3(p.TokPerS), Speedup: round3(p.Speedup)})
	}
}

// specTable shows the projection.
func specTable(model, group string, ps []simSpec) *report.Table {
	t := &report.Table{Title: fmt.Sprintf("One stream's decode with speculative decoding (%s on %s)", model, group),
		Header: []string{"acceptance per token", "k", "tokens per step", "verify step", "tok/s", "speed-up"}}
	for _, p := range ps {
		t.Addf([]string{"%.1f", "%d", "%.2f", "%.1f ms", "%.1f", "%.2fx"}, p.Acceptance, p.K, p.TokensPerStep, p.StepMS, p.TokPerS, p.Speedup)
	}
	t.Notes = []string{"The verify step of k+1 rows is priced by the weights it reads (every non-expert tensor once, each routed expert any row picks, rows routed independently: an upper bound), scaled from the profile's one-row decode step; k is the decode group's own choice (draft.Best, at most 4). Published acceptance: EAGLE-3 for K3 2.4-3.6 tokens a step; prompt lookup 2-4x on code editing."}
	return t
}
