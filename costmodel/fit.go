package costmodel

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// Sample is one measured piece of prefill: Work done in Calls layer calls
// took Took, of which Attention in the MLA attention when the worker timed
// that apart (zero: not timed).
type Sample struct {
	Work      FLOPs
	Calls     int
	Took      time.Duration
	Attention time.Duration
}

// Fit returns base's rates scaled to explain samples. The linear work
// keeps base's ratios under one factor, the MLA attention has a factor of
// its own, and each layer call a fixed cost; worst is the largest relative
// error left over the samples. A base with unknown rates counts as equal
// rates. Fit fails when there are no samples, when a sample is not a
// measurement, and when the time does not grow with the work.
// docs/ARCHITECTURE.md, "Fitting the cost model", says how the fit's form
// is chosen.
func Fit(base Compute, samples []Sample) (fit Compute, worst float64, err error) {
	if !base.Known() {
		base = Uniform(1, 0)
	}
	base.Layer = 0
	lin := base
	lin.MLAAttention = math.Inf(1) // attention apart
	rows := make([]fitRow, 0, len(samples))
	for i, s := range samples {
		if s.Took <= 0 || s.Calls < 0 || !(s.Work.Total() > 0) || math.IsInf(s.Work.Total(), 0) {
			return Compute{}, 0, fmt.Errorf("fit: sample %d (%.3g FLOP in %d layer calls, %v) is not a measurement", i, s.Work.Total(), s.Calls, s.Took)
		}
		if s.Attention < 0 || s.Attention > s.Took || s.Attention > 0 && !(s.Work.Attn > 0) {
			return Compute{}, 0, fmt.Errorf("fit: sample %d spent %v in the attention of %.3g FLOP, of %v in all: not a measurement", i, s.Attention, s.Work.Attn, s.Took)
		}
		rows = append(rows, fitRow{s.Work.seconds(lin), s.Work.Attn / base.Attention() / 1e9, float64(s.Calls), s.Took.Seconds()})
	}
	if len(rows) == 0 {
		return Compute{}, 0, errors.New("fit: no samples")
	}
	all := rows
	attnFactor, timed := timedAttention(samples, rows)
	if timed {
		if rows = withoutAttention(rows, attnFactor); len(rows) == 0 {
			return Compute{}, 0, errors.New("fit: the attention took all of every time measured")
		}
	}
	sizes := sizeGroups(rows)
	if len(sizes) >= 2 {
		// Times that do not grow with the work measure something else.
		if x, err := (fitForm{calls: true}).solve(rows); err == nil && !(x[0] > 0) {
			return Compute{}, 0, errors.New("fit: the time does not grow with the work; measure longer prompts")
		}
	}
	// The forms by their error on the sizes left out, simplest first on a
	// tie; the first whose fit to every sample has the time grow with the
	// work (the single factor always does).
	type ranked struct {
		f   fitForm
		err float64
	}
	var forms []ranked
	for _, f := range fitForms {
		if len(sizes) <= f.terms() && f != fitForms[0] {
			continue
		}
		if f.attn && !hasAttn(rows) {
			continue
		}
		forms = append(forms, ranked{f, f.crossError(rows, sizes)})
	}
	slices.SortStableFunc(forms, func(a, b ranked) int {
		if a.err < b.err*(1-1e-9) {
			return -1
		}
		if b.err < a.err*(1-1e-9) {
			return 1
		}
		return 0
	})
	var x []float64
	for _, r := range forms {
		y, err := r.f.solve(rows)
		if err != nil {
			return Compute{}, 0, fmt.Errorf("fit: %w", err)
		}
		if y[0] > 0 {
			x = y
			break
		}
	}
	if x == nil {
		return Compute{}, 0, errors.New("fit: the time does not grow with the work; measure longer prompts")
	}
	attn := x[1]
	if timed {
		attn = attnFactor
		x[1] = attn
	}
	if !(attn > 0) {
		attn = x[0] // no attention in the samples: keep base's ratio
	}
	fit = Compute{KDA: base.KDA / x[0], MLA: base.MLA / x[0], MLAAttention: base.Attention() / attn, MoE: base.MoE / x[0],
		Dense: base.Dense / x[0], Layer: time.Duration(math.Round(x[2] * float64(time.Second)))}
	for _, r := range all {
		worst = max(worst, math.Abs(r.predict(x)-r.took)/r.took)
	}
	return fit, worst, nil
}

// timedAttention is the attention's factor from the samples that timed
// it. The time in the attention op need not be all per (query, key) pair:
// each call of it may also pay per row (its softmax state, the output).
// So over samples of two sizes or more the
// timed seconds are fitted as a part per row (in proportion to the linear
// work) plus a part per pair, by non-negative least squares on relative
// errors, and the factor is the per-pair part's; the per-row part stays
// with the linear work. Samples of one size give their attention seconds
// over their attention work.
func timedAttention(samples []Sample, rows []fitRow) (factor float64, ok bool) {
	var timed []fitRow
	var took, at float64
	for i, s := range samples {
		if s.Attention > 0 {
			a := s.Attention.Seconds()
			timed = append(timed, fitRow{l: rows[i].l, at: rows[i].at, took: a})
			took += a
			at += rows[i].at
		}
	}
	if !(at > 0) {
		return 0, false
	}
	if len(sizeGroups(timed)) >= 2 {
		a := make([][]float64, len(timed))
		b := make([]float64, len(timed))
		for i, r := range timed {
			a[i], b[i] = []float64{r.l / r.took, r.at / r.took}, 1
		}
		if x, err := nnls(a, b); err == nil && x[1] > 0 {
			return x[1], true
		}
	}
	return took / at, true
}

// withoutAttention is the rows less their attention's per-pair part at the
// factor. A row whose time that leaves nothing of says nothing of the rest
// and is left out.
func withoutAttention(rows []fitRow, factor float64) []fitRow {
	rest := make([]fitRow, 0, len(rows))
	for _, r := range rows {
		a := factor * r.at
		if r.took-a > 0 {
			rest = append(rest, fitRow{l: r.l, calls: r.calls, took: r.took - a})
		}
	}
	return rest
}

// fitForm is one of the nested forms Fit chooses among: which of the
// attention's own factor and the fixed cost per call it fits.
type fitForm struct{ attn, calls bool }

// fitForms, simplest first: a tie goes to the simpler form.
var fitForms = []fitForm{{false, false}, {false, true}, {true, false}, {true, true}}

func (f fitForm) terms() int {
	n := 1
	if f.attn {
		n++
	}
	if f.calls {
		n++
	}
	return n
}

// solve fits the form to rows: x = [linear factor, attention factor,
// seconds per layer call] (the attention's factor is the linear one's when
// the form does not tell them apart). An attention factor of zero, or a
// thousandth of the linear work's (no machine does attention that much
// faster per FLOP), is noise: the form falls back to one factor for both.
func (f fitForm) solve(rows []fitRow) ([]float64, error) {
	a := make([][]float64, len(rows))
	b := make([]float64, len(rows))
	for i, r := range rows {
		w := 1 / r.took
		row := []float64{r.l * w}
		if f.attn {
			row = append(row, r.at*w)
		} else {
			row[0] += r.at * w
		}
		if f.calls {
			row = append(row, r.calls*w)
		}
		a[i], b[i] = row, 1
	}
	y, err := nnls(a, b)
	if err != nil {
		return nil, err
	}
	x := []float64{y[0], y[0], 0}
	k := 1
	if f.attn {
		x[1] = y[1]
		k++
		if !(x[1] > x[0]*1e-3) && hasAttn(rows) {
			return fitForm{false, f.calls}.solve(rows)
		}
	}
	if f.calls {
		x[2] = y[k]
	}
	return x, nil
}

// crossError is the form's mean squared relative error over the samples of
// each size when fitted to the samples of the other sizes (infinite when it
// cannot be fitted without some size).
func (f fitForm) crossError(rows []fitRow, sizes [][]int) float64 {
	if len(sizes) < 2 {
		return 0 // nothing to leave out: only the single factor comes here
	}
	var sum float64
	n := 0
	for g, out := range sizes {
		var rest []fitRow
		for h, in := range sizes {
			if h != g {
				for _, i := range in {
					rest = append(rest, rows[i])
				}
			}
		}
		x, err := f.solve(rest)
		if err != nil || !(x[0] > 0) {
			return math.Inf(1)
		}
		for _, i := range out {
			e := (rows[i].predict(x) - rows[i].took) / rows[i].took
			sum += e * e
			n++
		}
	}
	return sum / float64(n)
}

// sizeGroups groups the rows of the same work (within 1%), in order of
// their first row.
func sizeGroups(rows []fitRow) [][]int {
	var groups [][]int
	for i, r := range rows {
		found := false
		for g, in := range groups {
			q := rows[in[0]]
			if close(r.l, q.l) && close(r.at, q.at) && close(r.calls, q.calls) {
				groups[g] = append(groups[g], i)
				found = true
				break
			}
		}
		if !found {
			groups = append(groups, []int{i})
		}
	}
	return groups
}

func close(a, b float64) bool { return math.Abs(a-b) <= 0.01*max(math.Abs(a), math.Abs(b)) }

// fitRow is a sample as Fit sees it: seconds of linear work and of
// attention at base's rates, layer calls, seconds measured.
type fitRow struct{ l, at, calls, took float64 }

// predict is the row's seconds at factors x.
func (r fitRow) predict(x []float64) float64 { return x[0]*r.l + x[1]*r.at + x[2]*r.calls }

func hasAttn(rows []fitRow) bool {
	for _, r := range rows {
		if r.at > 0 {
			return true
		}
	}
	return false
}

// Fitter keeps a worker's recent samples and their fit: the newest
// PerBucket samples of each power-of-two size class of work. When the kept
// samples cannot be fitted together the oldest give way, and the new
// sample is always kept. The first sample serves alone until the second
// replaces it. Safe for concurrent use.
type Fitter struct {
	base Compute

	mu      sync.Mutex
	buckets map[int][]kept
	seq     uint64
	fit     Compute
	worst   float64
	n       int
}

// kept is a sample and the order it came in.
type kept struct {
	Sample
	seq uint64
}

// PerBucket is how many samples of one size class a Fitter keeps.
const PerBucket = 4

// NewFitter starts with base's ratios between the linear terms (equal
// rates when base is unknown) and no fit.
func NewFitter(base Compute) *Fitter {
	return &Fitter{base: base, buckets: map[int][]kept{}}
}

// Add records a sample and refits; a sample that is not a measurement is
// refused with the reason.
func (f *Fitter) Add(s Sample) error {
	if _, _, err := Fit(f.base, []Sample{s}); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, e := math.Frexp(s.Work.Total())
	f.seq++
	if f.seq == 2 {
		clear(f.buckets) // the first, cold
	}
	b := append(f.buckets[e], kept{s, f.seq})
	if len(b) > PerBucket {
		b = b[len(b)-PerBucket:]
	}
	f.buckets[e] = b
	for {
		fit, worst, err := Fit(f.base, f.samples())
		if err == nil {
			f.fit, f.worst, f.n = fit, worst, f.count()
			return nil
		}
		if !f.dropOldest() {
			return err // not reached: the new sample alone fits
		}
	}
}

// samples are the kept samples, by size class, oldest first in each.
func (f *Fitter) samples() []Sample {
	keys := make([]int, 0, len(f.buckets))
	for k := range f.buckets {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var all []Sample
	for _, k := range keys {
		for _, x := range f.buckets[k] {
			all = append(all, x.Sample)
		}
	}
	return all
}

func (f *Fitter) count() int {
	n := 0
	for _, b := range f.buckets {
		n += len(b)
	}
	return n
}

// dropOldest drops the oldest kept sample unless it is the only one left.
func (f *Fitter) dropOldest() bool {
	if f.count() <= 1 {
		return false
	}
	key, oldest := 0, uint64(math.MaxUint64)
	for k, b := range f.buckets {
		if b[0].seq < oldest { // each bucket is oldest first
			key, oldest = k, b[0].seq
		}
	}
	if b := f.buckets[key][1:]; len(b) > 0 {
		f.buckets[key] = b
	} else {
		delete(f.buckets, key)
	}
	return true
}

// Compute is the current fit (zero before the first sample), the samples it
// rests on and its largest relative error over them.
func (f *Fitter) Compute() (c Compute, samples int, worst float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fit, f.n, f.worst
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

// NNLS solves min |Ax - b| subject to x >= 0 for a few columns (the
// simulator's calibration fits use it too).
func NNLS(a [][]float64, b []float64) ([]float64, error) {
	if len(a) == 0 || len(a) != len(b) {
		return nil, fmt.Errorf("nnls: %d rows and %d targets", len(a), len(b))
	}
	for i, r := range a {
		if len(r) != len(a[0]) {
			return nil, fmt.Errorf("nnls: row %d has %d columns, row 0 has %d", i, len(r), len(a[0]))
		}
	}
	return nnls(a, b)
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
			return nil, errors.New("the samples cannot tell the terms apart (singular system)")
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
