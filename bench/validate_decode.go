package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// Targets of issue 17 (each a ratio measured in the same run, on a Mac).
const (
	targetCeiling = 0.60 // batch-1 decode step: the bandwidth ceiling over the measured step
	targetBatch16 = 6.0  // batch 16's tokens/s over batch 1's
)

// decodeFigure is a decode rank's figures: the whole model resident on the
// backend (one rank holding every layer, the embedding and the head).
type decodeFigure struct {
	Model         string  `json:"model"`
	Layers        int     `json:"layers"`
	ResidentBytes int64   `json:"resident_bytes"`
	StepBytes     int64   `json:"batch1_step_bytes"` // weights one batch-1 step reads
	CopyGBps      float64 `json:"copy_gbps"`         // the measured bandwidth
	CeilingS      float64 `json:"ceiling_s"`         // StepBytes / CopyGBps
	Step1S        float64 `json:"batch1_step_s"`
	Ratio1        float64 `json:"ceiling_ratio"` // CeilingS / Step1S
	Met1          bool    `json:"ceiling_met"`
	Step16S       float64 `json:"batch16_step_s"`
	Speedup16     float64 `json:"batch16_speedup"` // batch 16's tok/s over batch 1's
	Met16         bool    `json:"batch16_met"`
	PrefillTokens int     `json:"prefill_tokens"`
	PrefillTokS   float64 `json:"prefill_tok_s"`
	GreedyTokens  int     `json:"greedy_tokens"`
	GreedyEqual   int     `json:"greedy_equal"` // prompts whose greedy ids equal the CPU's
	GreedyPrompts int     `json:"greedy_prompts"`
}

// copyRate measures the backend's memory bandwidth: a block copy that reads
// and writes n bytes.
func copyRate(be kernels.Backend, n int) float64 {
	cols := 4096
	rows := max(1, n/4/cols)
	a, b := be.NewTensor(rows, cols), be.NewTensor(rows, cols)
	defer be.Free(a)
	defer be.Free(b)
	d := best(3, func() time.Duration {
		t := time.Now()
		be.CopyBlock(b, 0, 0, a, 0, 0, rows, cols)
		syncOn(be, b)
		return time.Since(t)
	})
	return 2 * float64(rows*cols*4) / d.Seconds() / 1e9
}

// stepBytes is what one batch-1 decode step reads of the weights: every
// matrix except the routed experts, top-k experts per MoE layer, the
// lm_head and one embedding row.
func stepBytes(m *model.Model) (step, resident int64) {
	for _, l := range m.Layers {
		if l == nil {
			continue
		}
		routed := make(map[*kernels.Matrix]bool)
		if l.MoE != nil {
			for _, e := range l.MoE.Experts {
				routed[e.W1], routed[e.W3], routed[e.W2] = true, true, true
			}
			if len(l.MoE.Experts) > 0 {
				e := l.MoE.Experts[0]
				step += int64(min(m.Cfg.TopK, len(l.MoE.Experts))) * int64(e.W1.Bytes()+e.W3.Bytes()+e.W2.Bytes())
			}
		}
		for _, w := range l.Matrices() {
			resident += int64(w.Bytes())
			if !routed[w] {
				step += int64(w.Bytes())
			}
		}
	}
	if g := m.Globals; g != nil {
		resident += int64(g.Embed.Bytes() + g.LMHead.Bytes())
		step += int64(g.LMHead.Bytes() + g.Embed.Bytes()/g.Embed.Rows)
	}
	return step, resident
}

// measureRankDecode loads the whole model on the backend and measures local
// prefill, decode steps at batch 1 and 16, and greedy ids against the CPU.
func measureRankDecode(ctx context.Context, be kernels.Backend, f validateConfig, rep *validateReport, logf func(string, ...any)) error {
	dir, err := f.checkpoint(ctx, "metal")
	if err != nil {
		return err
	}
	m, err := model.Load(dir, be, model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		return err
	}
	defer m.Close()
	d := &decodeFigure{Model: dir, Layers: m.Cfg.NumLayers, PrefillTokens: f.passTokens}
	d.StepBytes, d.ResidentBytes = stepBytes(m.Model)
	d.CopyGBps = copyRate(be, f.copyMiB<<20)
	d.CeilingS = float64(d.StepBytes) / (d.CopyGBps * 1e9)
	if err := decodeSteps(ctx, m, d); err != nil {
		return err
	}
	d.Ratio1 = d.CeilingS / d.Step1S
	d.Met1 = d.Ratio1 >= targetCeiling
	d.Speedup16 = (16 / d.Step16S) / (1 / d.Step1S)
	d.Met16 = d.Speedup16 >= targetBatch16
	// Greedy ids against the CPU backend on the same checkpoint.
	d.GreedyPrompts, d.GreedyTokens = 4, f.greedyTokens
	notes, err := greedyAgainstCPU(ctx, m, dir, d)
	if err != nil {
		return err
	}
	rep.Notes = append(rep.Notes, notes...)
	rep.Decode = d
	logf("decode: %d layers, %s resident, a batch-1 step reads %s; bandwidth %.1f GB/s -> ceiling %.4f s; step %.4f s: %.2f of the ceiling (target >= %.2f); batch 16 step %.4f s: %.2fx batch 1's tok/s (target >= %.0f); local prefill %.1f tok/s; greedy ids equal the CPU's on %d of %d prompts",
		d.Layers, progress.HumanBytes(d.ResidentBytes), progress.HumanBytes(d.StepBytes), d.CopyGBps, d.CeilingS, d.Step1S, d.Ratio1, targetCeiling,
		d.Step16S, d.Speedup16, targetBatch16, d.PrefillTokS, d.GreedyEqual, d.GreedyPrompts)
	return nil
}

// decodePrompt is a deterministic prompt of n tokens for a vocabulary of
// vocab.
func decodePrompt(n, seed, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*7919 + seed*104729 + 13) % vocab)
	}
	return p
}

// decodeSteps measures into d the local prefill of one prompt of
// d.PrefillTokens and the decode step at batch 1 (after that prompt) and
// at batch 16.
func decodeSteps(ctx context.Context, m *model.Loaded, d *decodeFigure) error {
	cfg := m.Cfg
	st := m.NewState(0, cfg.NumLayers)
	t0 := time.Now()
	logits, err := m.Prefill(ctx, []*model.SeqState{st}, [][]int32{decodePrompt(d.PrefillTokens, 0, cfg.VocabSize)})
	if err != nil {
		return fmt.Errorf("local prefill: %w", err)
	}
	d.PrefillTokS = float64(d.PrefillTokens) / time.Since(t0).Seconds()
	s1, err := bestDecodeStep(ctx, m, []*model.SeqState{st}, []int32{int32(model.Argmax(logits[0]))})
	if err != nil {
		return fmt.Errorf("decode at batch 1: %w", err)
	}
	d.Step1S = s1.Seconds()
	seqs, firsts := make([]*model.SeqState, 16), make([][]int32, 16)
	for i := range seqs {
		seqs[i], firsts[i] = m.NewState(0, cfg.NumLayers), decodePrompt(8, i+1, cfg.VocabSize)
	}
	lg, err := m.Prefill(ctx, seqs, firsts)
	if err != nil {
		return fmt.Errorf("prefill of the batch-16 prompts: %w", err)
	}
	ids := make([]int32, 16)
	for i := range ids {
		ids[i] = int32(model.Argmax(lg[i]))
	}
	s16, err := bestDecodeStep(ctx, m, seqs, ids)
	if err != nil {
		return fmt.Errorf("decode at batch 16: %w", err)
	}
	d.Step16S = s16.Seconds()
	return nil
}

// bestDecodeStep is the best of a few decode steps of seqs, each a whole
// step through every layer, fed ids and then their greedy successors.
func bestDecodeStep(ctx context.Context, m *model.Loaded, seqs []*model.SeqState, ids []int32) (time.Duration, error) {
	var bestD time.Duration
	for i := 0; i < 4; i++ {
		t := time.Now()
		out, err := m.Decode(ctx, seqs, ids)
		if err != nil {
			return 0, err
		}
		if el := time.Since(t); i == 0 || el < bestD {
			bestD = el
		}
		for j := range ids {
			ids[j] = int32(model.Argmax(out[j]))
		}
	}
	return bestD, nil
}

// greedyAgainstCPU generates d.GreedyTokens greedy ids for each of
// d.GreedyPrompts prompts on m and on the CPU backend from dir, counts the
// equal ones into d and returns a note for each that differs.
func greedyAgainstCPU(ctx context.Context, m *model.Loaded, dir string, d *decodeFigure) ([]string, error) {
	ref, err := model.Load(dir, cpu.New(0), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		return nil, err
	}
	defer ref.Close()
	var notes []string
	for i := 0; i < d.GreedyPrompts; i++ {
		p := decodePrompt(16+4*i, 100+i, m.Cfg.VocabSize)
		want, err := ref.Generate(ctx, p, d.GreedyTokens)
		if err != nil {
			return nil, err
		}
		got, err := m.Generate(ctx, p, d.GreedyTokens)
		if err != nil {
			return nil, err
		}
		if slices.Equal(got, want) {
			d.GreedyEqual++
		} else {
			notes = append(notes, fmt.Sprintf("greedy prompt %d: %v on the backend, %v on the CPU", i, got, want))
		}
	}
	return notes, nil
}

// decodeMarkdown renders the decode figures.
func decodeMarkdown(d *decodeFigure) (title, body string) {
	met := map[bool]string{true: "met", false: "NOT met"}
	return "Decode rank (every layer resident)", fmt.Sprintf(
		"%d layers of %s, %s resident. Bandwidth measured in this run (block copy): %.1f GB/s. "+
			"A batch-1 step reads %s of weights (every matrix but the routed experts, top-k experts per MoE layer, the lm_head): ceiling %.4f s; "+
			"measured %.4f s = %.2f of the ceiling (target >= %.2f: %s). Batch 16: step %.4f s, %.2fx batch 1's tokens/s (target >= %.0f: %s). "+
			"Local prefill: %.1f tokens/s over %d tokens. Greedy ids over %d tokens equal the CPU backend's on %d of %d prompts.",
		d.Layers, d.Model, progress.HumanBytes(d.ResidentBytes), d.CopyGBps, progress.HumanBytes(d.StepBytes), d.CeilingS, d.Step1S, d.Ratio1,
		targetCeiling, met[d.Met1], d.Step16S, d.Speedup16, targetBatch16, met[d.Met16], d.PrefillTokS, d.PrefillTokens, d.GreedyTokens,
		d.GreedyEqual, d.GreedyPrompts)
}
