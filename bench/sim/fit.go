package sim

import (
	"errors"
	"fmt"
	"math"

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
// layer call that best explain measured layer times: time = Σ FLOPs_type /
// rate_type + overhead, by non-negative least squares on relative errors.
//
// Every layer holds an attention and a feed-forward sublayer, so layer
// times fix only sums: a cost moved from every attention sublayer to every
// feed-forward one (KDA and MLA projections against MoE and dense) explains
// them as well. Among such fits it takes the one whose linear rates are
// closest to equal (a light penalty on their differences); the MLA
// attention's rate is told apart by its growth with the context, so the
// samples must hold the MLA layers at two or more lengths. Predictions for
// the measured model do not depend on the choice.
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
	x, err := nnls(a, b)
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

// nnls solves min |Ax - b| subject to x >= 0 (Lawson and Hanson's active
// set method; the problems here have a handful of columns).
func nnls(a [][]float64, b []float64) ([]float64, error) {
	n := len(a[0])
	x := make([]float64, n)
	passive := make([]bool, n)
	const tol = 1e-12
	grad := func() []float64 { // Aᵀ(b - Ax)
		w := make([]float64, n)
		for i, row := range a {
			r := b[i]
			for j, v := range row {
				r -= v * x[j]
			}
			for j, v := range row {
				w[j] += v * r
			}
		}
		return w
	}
	for iter := 0; iter < 10*n; iter++ {
		w := grad()
		best, bj := tol, -1
		for j := range w {
			if !passive[j] && w[j] > best {
				best, bj = w[j], j
			}
		}
		if bj < 0 {
			return x, nil
		}
		passive[bj] = true
		for inner := 0; inner < 10*n; inner++ {
			s, err := lsq(a, b, passive)
			if err != nil {
				return nil, err
			}
			ok := true
			for j := range s {
				if passive[j] && s[j] <= tol {
					ok = false
				}
			}
			if ok {
				copy(x, s)
				break
			}
			alpha := math.Inf(1)
			for j := range s {
				if passive[j] && s[j] <= tol {
					alpha = min(alpha, x[j]/(x[j]-s[j]))
				}
			}
			for j := range x {
				x[j] += alpha * (s[j] - x[j])
				if passive[j] && x[j] <= tol {
					passive[j], x[j] = false, 0
				}
			}
		}
	}
	return x, nil
}

// lsq solves the least-squares problem on the passive columns (the others
// are zero) by the normal equations.
func lsq(a [][]float64, b []float64, passive []bool) ([]float64, error) {
	var cols []int
	for j, p := range passive {
		if p {
			cols = append(cols, j)
		}
	}
	m := len(cols)
	g := make([][]float64, m) // [AᵀA | Aᵀb]
	for r := range g {
		g[r] = make([]float64, m+1)
	}
	for i, row := range a {
		for r, jr := range cols {
			for c, jc := range cols {
				g[r][c] += row[jr] * row[jc]
			}
			g[r][m] += row[jr] * b[i]
		}
	}
	for col := 0; col < m; col++ { // Gaussian elimination, partial pivoting
		p := col
		for r := col + 1; r < m; r++ {
			if math.Abs(g[r][col]) > math.Abs(g[p][col]) {
				p = r
			}
		}
		if math.Abs(g[p][col]) < 1e-300 {
			return nil, errors.New("the samples cannot tell the layer types apart (singular system)")
		}
		g[col], g[p] = g[p], g[col]
		for r := 0; r < m; r++ {
			if r == col {
				continue
			}
			f := g[r][col] / g[col][col]
			for c := col; c <= m; c++ {
				g[r][c] -= f * g[col][c]
			}
		}
	}
	x := make([]float64, len(passive))
	for r, j := range cols {
		x[j] = g[r][m] / g[r][r]
	}
	return x, nil
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
	x, err := nnls(a, b)
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
	lin := base
	lin.MLAAttention = math.Inf(1) // attention apart
	parts := func(n int) (l, at, calls float64) {
		for lo := 0; lo < n-1; lo += chunk {
			f := PromptFLOPs(c, lo, min(n-1, lo+chunk))
			l += f.Time(lin).Seconds()
			at += f.Attn / base.attention() / 1e9
			calls += float64(c.NumLayers)
		}
		return
	}
	a := make([][]float64, len(samples))
	b := make([]float64, len(samples))
	for i, s := range samples {
		if s.Prompt < 2 || !(s.Seconds > step) {
			return GroupFit{}, fmt.Errorf("fit group: sample %d (%d tokens in %v s, step %v s) is not a measured prefill", i, s.Prompt, s.Seconds, step)
		}
		l, at, calls := parts(s.Prompt)
		w := 1 / s.Seconds
		a[i] = []float64{l * w, at * w, calls * w}
		b[i] = 1 - step*w
	}
	x, err := scaleFit(a, b)
	if err != nil {
		return GroupFit{}, fmt.Errorf("fit group: %w", err)
	}
	g := GroupFit{OverheadMS: x[2] * 1e3}
	g.Rates = Compute{KDA: base.KDA / x[0], MLA: base.MLA / x[0], MLAAttention: base.attention() / x[1], MoE: base.MoE / x[0], Dense: base.Dense / x[0]}
	for _, s := range samples {
		l, at, calls := parts(s.Prompt)
		p := x[0]*l + x[1]*at + x[2]*calls + step
		g.WorstError = max(g.WorstError, math.Abs(p-s.Seconds)/s.Seconds)
	}
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
	lin := base
	lin.MLAAttention = math.Inf(1) // attention apart
	parts := func(n int) (l, at float64) {
		f := PromptFLOPs(c, 0, n)
		return f.Time(lin).Seconds(), f.Attn / base.attention() / 1e9
	}
	a := make([][]float64, len(samples))
	b := make([]float64, len(samples))
	for i, s := range samples {
		if s.Tokens < 1 || !(s.Seconds > 0) {
			return ComputeFit{}, fmt.Errorf("fit passes: sample %d (%d tokens in %v s) is not a measured pass", i, s.Tokens, s.Seconds)
		}
		l, at := parts(s.Tokens)
		w := 1 / s.Seconds
		a[i] = []float64{l * w, at * w, float64(c.NumLayers) * w}
		b[i] = 1
	}
	x, err := scaleFit(a, b)
	if err != nil {
		return ComputeFit{}, fmt.Errorf("fit passes: %w", err)
	}
	fit := ComputeFit{OverheadMS: x[2] * 1e3,
		Rates: Compute{KDA: base.KDA / x[0], MLA: base.MLA / x[0], MLAAttention: base.attention() / x[1], MoE: base.MoE / x[0], Dense: base.Dense / x[0]}}
	for _, s := range samples {
		l, at := parts(s.Tokens)
		p := x[0]*l + x[1]*at + x[2]*float64(c.NumLayers)
		fit.WorstResidual = max(fit.WorstResidual, math.Abs(p-s.Seconds)/s.Seconds)
	}
	return fit, nil
}

// scaleFit solves the scaling fits of FitGroup and FitPasses: rows of
// (linear work, attention work, fixed-cost count) against their targets,
// for a factor on each kind of work and the fixed cost. When the samples
// do not tell the attention apart (its factor fits to zero: too little
// attention work for the noise, as in short prompts on a small model), one
// factor is fitted for both kinds of work instead.
func scaleFit(a [][]float64, b []float64) ([]float64, error) {
	x, err := nnls(a, b)
	if err != nil {
		return nil, err
	}
	if x[0] > 0 && x[1] > 0 {
		return x, nil
	}
	one := make([][]float64, len(a))
	for i, r := range a {
		one[i] = []float64{r[0] + r[1], r[2]}
	}
	y, err := nnls(one, b)
	if err != nil {
		return nil, err
	}
	if !(y[0] > 0) {
		return nil, errors.New("the time does not grow with the prompt as compute does; measure longer prompts")
	}
	return []float64{y[0], y[0], y[1]}, nil
}
