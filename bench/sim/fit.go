package sim

import (
	"errors"
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/model"
)

// LayerSample is one measured layer call: layer L over positions [Lo, Hi)
// of one sequence took Seconds.
type LayerSample struct {
	Layer   int
	Lo, Hi  int
	Seconds float64
}

// ComputeFit is the result of FitCompute.
type ComputeFit struct {
	Rates Compute
	// OverheadMS is the fixed cost of one layer call.
	OverheadMS float64
	// WorstResidual is the largest |predicted - measured| / measured over
	// the samples.
	WorstResidual float64
}

// regularization weighs the preference for equal rates among the linear
// layer types (see FitCompute).
const regularization = 0.1

// FitCompute finds the compute rates per layer type and the fixed cost per
// layer call that best explain measured layer times, time = Σ FLOPs_type /
// rate_type + overhead, by non-negative least squares on relative errors.
// Layer times fix only the sums of a layer's attention and feed-forward
// sublayers, so among equally good fits it takes the one whose linear rates
// are closest to equal, by a light penalty on their differences;
// predictions for the measured model do not depend on that choice. The MLA
// attention's rate is told apart by its growth with the context, so the
// samples must hold the MLA layers at two or more lengths.
func FitCompute(c *model.Config, samples []LayerSample) (ComputeFit, error) {
	const nv = 6 // kda, mla, attn, moe, dense: seconds per GFLOP; overhead: seconds
	if len(samples) < nv {
		return ComputeFit{}, fmt.Errorf("fit: %d samples, need at least %d for 5 rates and an overhead", len(samples), nv)
	}
	var a [][]float64
	var b []float64
	var seen [5]bool
	var flops, secs float64
	for i, s := range samples {
		if s.Layer < 0 || s.Layer >= c.NumLayers || s.Hi <= s.Lo || s.Lo < 0 || !(s.Seconds > 0) {
			return ComputeFit{}, fmt.Errorf("fit: sample %d (layer %d, [%d,%d), %v s) is not a measurement", i, s.Layer, s.Lo, s.Hi, s.Seconds)
		}
		f := LayerFLOPs(c, s.Layer, s.Lo, s.Hi)
		v := []float64{f.KDA, f.MLA, f.Attn, f.MoE, f.Dense}
		// Weighted by 1/measured so that every sample counts by its
		// relative error.
		w := 1 / s.Seconds
		row := make([]float64, nv)
		for k, x := range v {
			row[k] = x / 1e9 * w
			seen[k] = seen[k] || x > 0
		}
		row[5] = w
		a, b = append(a, row), append(b, 1)
		flops += f.Total() / 1e9
		secs += s.Seconds
	}
	names := []string{"kda", "mla", "mla attention", "moe", "dense"}
	for k, name := range names {
		if !seen[k] {
			return ComputeFit{}, fmt.Errorf("fit: no sample has %s work", name)
		}
	}
	// Equal linear rates unless the samples say otherwise: rows
	// λ·(x_k - x_j)/x̄ = 0, x̄ the mean seconds per GFLOP.
	mean := secs / flops
	linear := []int{0, 1, 3, 4}
	for i, k := range linear {
		for _, j := range linear[i+1:] {
			row := make([]float64, nv)
			row[k], row[j] = regularization/mean, -regularization/mean
			a, b = append(a, row), append(b, 0)
		}
	}
	x, err := costmodel.NNLS(a, b)
	if err != nil {
		return ComputeFit{}, fmt.Errorf("fit: %w", err)
	}
	var errs []error
	rate := func(k int) float64 {
		if !(x[k] > 0) {
			errs = append(errs, fmt.Errorf("fit: the %s rate fits as infinite (no measurable cost); measure longer prompts", names[k]))
			return 0
		}
		return 1 / x[k]
	}
	var fit ComputeFit
	fit.Rates = Compute{KDA: rate(0), MLA: rate(1), MLAAttention: rate(2), MoE: rate(3), Dense: rate(4)}
	if err := errors.Join(errs...); err != nil {
		return ComputeFit{}, err
	}
	fit.OverheadMS = x[5] * 1e3
	for _, s := range samples {
		p := LayerFLOPs(c, s.Layer, s.Lo, s.Hi).Time(fit.Rates).Seconds() + x[5]
		fit.WorstResidual = max(fit.WorstResidual, math.Abs(p-s.Seconds)/s.Seconds)
	}
	return fit, nil
}

// FitReads fits per-layer read times to latency + bytes/rate (non-negative,
// relative errors) and returns the rate in GB/s and the latency in ms.
func FitReads(bytes []int64, seconds []float64) (gbps, latencyMS float64, err error) {
	if len(bytes) != len(seconds) || len(bytes) < 2 {
		return 0, 0, fmt.Errorf("fit reads: %d sizes and %d times, want two or more of each", len(bytes), len(seconds))
	}
	a := make([][]float64, len(bytes))
	b := make([]float64, len(bytes))
	for i := range bytes {
		if bytes[i] <= 0 || !(seconds[i] > 0) {
			return 0, 0, fmt.Errorf("fit reads: layer %d read %d bytes in %v s", i, bytes[i], seconds[i])
		}
		w := 1 / seconds[i]
		a[i] = []float64{float64(bytes[i]) / 1e9 * w, w}
		b[i] = 1
	}
	x, err := costmodel.NNLS(a, b)
	if err != nil {
		return 0, 0, fmt.Errorf("fit reads: %w", err)
	}
	if !(x[0] > 0) {
		return 0, 0, errors.New("fit reads: the read time does not grow with the layer's size (latency-bound reads); read a larger model")
	}
	return 1 / x[0], x[1] * 1e3, nil
}

// GroupSample is a measured local prefill on a decode group: a prompt of
// Prompt tokens took Seconds from its admission to its first token (the
// prefill of all but the last token, in chunks, then one decode step).
type GroupSample struct {
	Prompt  int
	Seconds float64
}

// GroupFit is the result of FitGroup.
type GroupFit struct {
	Rates Compute
	// OverheadMS is the fixed cost per layer and chunk.
	OverheadMS float64
	// WorstError is the largest |predicted - measured| / measured.
	WorstError float64
}

// FitGroup explains a decode group's measured local prefills by the
// prefill box's rates scaled by two factors, one for the linear work and
// one for the MLA attention (the group runs the same kernels, but in chunks
// of chunk rows and with attention over a growing cache), plus a fixed cost
// per layer and chunk (mesh hops, the stage loop), by non-negative least
// squares on relative errors. step is the group's decode step in seconds.
func FitGroup(c *model.Config, base Compute, chunk int, step float64, samples []GroupSample) (GroupFit, error) {
	if len(samples) < 3 || chunk < 1 {
		return GroupFit{}, fmt.Errorf("fit group: %d samples with chunks of %d, want at least 3 and a positive chunk", len(samples), chunk)
	}
	ss := make([]costmodel.Sample, len(samples))
	for i, s := range samples {
		if s.Prompt < 2 || !(s.Seconds > step) {
			return GroupFit{}, fmt.Errorf("fit group: sample %d (%d tokens in %v s, step %v s) is not a measured prefill", i, s.Prompt, s.Seconds, step)
		}
		n := s.Prompt - 1
		ss[i] = costmodel.Sample{Work: PromptFLOPs(c, 0, n), Calls: (n + chunk - 1) / chunk * c.NumLayers, Took: seconds(s.Seconds - step)}
	}
	fit, worst, err := costmodel.Fit(base, ss)
	if err != nil {
		return GroupFit{}, fmt.Errorf("fit group: %w", err)
	}
	g := GroupFit{OverheadMS: float64(fit.Layer) / 1e6, WorstError: worst}
	fit.Layer = 0
	g.Rates = fit
	return g, nil
}

// PassSample is a measured weight pass carrying one prompt: the prefill
// worker's compute (binding and running every layer) over Tokens tokens
// from the start of the prompt.
type PassSample struct {
	Tokens  int
	Seconds float64
}

// FitPasses explains a prefill worker's measured pass compute by base's
// rates scaled by two factors, one for the linear work and one for the MLA
// attention, plus a fixed cost per layer, by non-negative least squares on
// relative errors, as FitGroup does for a decode group. Rates fitted to
// layer calls on resident weights (bench calibrate) can miss what a pass
// pays: weights that arrive cold from the disk in every pass, and the
// reads and emission sharing the cores.
func FitPasses(c *model.Config, base Compute, samples []PassSample) (ComputeFit, error) {
	if len(samples) < 3 {
		return ComputeFit{}, fmt.Errorf("fit passes: %d samples, want at least 3", len(samples))
	}
	ss := make([]costmodel.Sample, len(samples))
	for i, s := range samples {
		if s.Tokens < 1 || !(s.Seconds > 0) {
			return ComputeFit{}, fmt.Errorf("fit passes: sample %d (%d tokens in %v s) is not a measured pass", i, s.Tokens, s.Seconds)
		}
		ss[i] = costmodel.Sample{Work: PromptFLOPs(c, 0, s.Tokens), Calls: c.NumLayers, Took: seconds(s.Seconds)}
	}
	fit, worst, err := costmodel.Fit(base, ss)
	if err != nil {
		return ComputeFit{}, fmt.Errorf("fit passes: %w", err)
	}
	out := ComputeFit{OverheadMS: float64(fit.Layer) / 1e6, WorstResidual: worst}
	fit.Layer = 0
	out.Rates = fit
	return out, nil
}
