package sim

import (
	"math"
	"strings"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/draft"
	"github.com/tandem-inference/tandem/model/synth"
)

// StepRead is what one decode step of one sequence reads of the weights,
// the bound of decode on the Macs: every tensor other than the routed
// experts once (of the embedding only the rows' own), and each routed
// expert that at least one of the step's rows picks. A verify step of
// k+1 rows therefore costs more than a step of one row only through the
// experts its extra rows add.
type StepRead struct {
	Fixed     int64 // bytes read once per step whatever the rows
	Expert    int64 // one routed expert of one MoE layer
	MoELayers int
	Experts   int // routed experts per MoE layer
	TopK      int
}

// NewStepRead derives m's step reads from its tensor plan.
func NewStepRead(m *Model) StepRead {
	c := m.Cfg
	r := StepRead{Experts: c.NumExperts, TopK: c.TopK}
	var experts int64
	plan := synth.Plan(c)
	for L, ts := range plan.Layers {
		if !c.IsDense(L) {
			r.MoELayers++
		}
		for _, t := range ts {
			if strings.Contains(t.Name, ".experts.") && !strings.Contains(t.Name, "shared_experts") {
				experts += t.Bytes()
				continue
			}
			r.Fixed += t.Bytes()
		}
	}
	for _, t := range plan.Globals {
		if !strings.Contains(t.Name, "embed_tokens") {
			r.Fixed += t.Bytes()
		}
	}
	if n := int64(r.MoELayers) * int64(r.Experts); n > 0 {
		r.Expert = experts / n
	}
	return r
}

// Bytes is the step's read for rows rows, with each row picking its TopK
// experts independently of the others: E·(1-(1-K/E)^rows) distinct
// experts per layer. Consecutive tokens share experts more often than
// chance, so this is an upper bound on the read and the projection built
// on it is conservative.
func (r StepRead) Bytes(rows int) float64 {
	if rows < 1 || r.Experts == 0 {
		return float64(r.Fixed)
	}
	e := float64(r.Experts)
	distinct := e * (1 - math.Pow(1-float64(r.TopK)/e, float64(rows)))
	return float64(r.Fixed) + float64(r.MoELayers)*distinct*float64(r.Expert)
}

// VerifyCost prices a decode step in which one sequence takes rows rows
// on group g: the group's measured one-row step (decode_step_ms) scaled by
// the bytes the step reads, the Macs being bound by memory bandwidth.
func VerifyCost(m *Model, g *DecodeGroup) func(rows int) time.Duration {
	r := NewStepRead(m)
	one := r.Bytes(1)
	step := g.DecodeStepMS * float64(time.Millisecond)
	return func(rows int) time.Duration {
		if one <= 0 {
			return time.Duration(step)
		}
		return time.Duration(step * r.Bytes(rows) / one)
	}
}

// SpecPoint is speculative decoding's projection for one stream at one
// per-token acceptance rate, with the k that draft.Best picks.
type SpecPoint struct {
	Acceptance    float64 // per drafted token
	K             int     // tokens drafted per step (0: drafting off)
	TokensPerStep float64 // accepted drafts plus the step's own token
	StepMS        float64 // the verify step of K+1 rows
	TokPerS       float64
	Speedup       float64 // over plain decoding on the same group
}

// ProjectSpec projects one stream's decode rate on group g for each
// acceptance rate, drafting at most kMax tokens a step, under the same
// cost rule the decode group applies (draft.Best over VerifyCost).
func ProjectSpec(m *Model, g *DecodeGroup, acceptance []float64, kMax int) []SpecPoint {
	cost := VerifyCost(m, g)
	base := cost(1).Seconds()
	out := make([]SpecPoint, 0, len(acceptance))
	for _, a := range acceptance {
		k := draft.Best(kMax, cost, a)
		p := SpecPoint{Acceptance: a, K: k, TokensPerStep: draft.Expected(k, a), StepMS: cost(k+1).Seconds() * 1e3}
		if p.StepMS > 0 && base > 0 {
			p.TokPerS = p.TokensPerStep / (p.StepMS / 1e3)
			p.Speedup = p.TokPerS * base
		}
		out = append(out, p)
	}
	return out
}
