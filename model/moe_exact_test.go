package model

import (
	"fmt"
	"math"
	"sort"
	"testing"

	"github.com/tandem-inference/tandem/internal/fixture"
)

// exactLatentMoE evaluates spec §3.6 on the moe fixture's weights in plain
// fp64, as independently of the backend as possible: matrix-vector
// products, a sort for top-k, no shared code with kernels/cpu.
func exactLatentMoE(t *testing.T, f *fixture.Fixture) []float64 {
	t.Helper()
	get := func(n string) ([]float64, []int) {
		x := fixTensor(t, f, n)
		o := make([]float64, len(x.Data))
		for i, v := range x.Data {
			o[i] = float64(v)
		}
		return o, x.Shape
	}
	mv := func(w []float64, shape []int, x []float64) []float64 {
		out := make([]float64, shape[0])
		for o := range out {
			for i := 0; i < shape[1]; i++ {
				out[o] += w[o*shape[1]+i] * x[i]
			}
		}
		return out
	}
	situMLP := func(w1, w3, w2 string, x []float64) []float64 {
		a, as := get(w1)
		b, bs := get(w3)
		c, cs := get(w2)
		g, u := mv(a, as, x), mv(b, bs, x)
		for i := range g {
			g[i] = 4 * math.Tanh(g[i]/4) / (1 + math.Exp(-g[i])) * 25 * math.Tanh(u[i]/25)
		}
		return mv(c, cs, g)
	}
	in, inShape := get("in")
	gw, gs := get("gate_weight")
	bias, _ := get("e_score_correction_bias")
	dw, ds := get("down_weight")
	uw, us := get("up_weight")
	nw, _ := get("norm_weight")
	d, k := inShape[2], 2
	var out []float64
	for r := 0; r < inShape[1]; r++ {
		x := in[r*d : (r+1)*d]
		lg := mv(gw, gs, x)
		s := make([]float64, len(lg))
		idx := make([]int, len(lg))
		for e := range s {
			s[e] = 1 / (1 + math.Exp(-lg[e]))
			idx[e] = e
		}
		sort.SliceStable(idx, func(i, j int) bool { return s[idx[i]]+bias[idx[i]] > s[idx[j]]+bias[idx[j]] })
		var sum float64
		for _, e := range idx[:k] {
			sum += s[e]
		}
		z := mv(dw, ds, x)
		u := make([]float64, len(z))
		for _, e := range idx[:k] {
			p := fmt.Sprintf("experts_%d_", e)
			y := situMLP(p+"w1_weight", p+"w3_weight", p+"w2_weight", z)
			for i := range u {
				u[i] += s[e] / (sum + 1e-20) * y[i]
			}
		}
		var ms float64
		for _, v := range u {
			ms += v * v
		}
		inv := 1 / math.Sqrt(ms/float64(len(u))+1e-5)
		for i := range u {
			u[i] *= inv * nw[i]
		}
		y := mv(uw, us, u)
		sh := situMLP("shared_w1_weight", "shared_w3_weight", "shared_w2_weight", x)
		for i := range y {
			out = append(out, y[i]+sh[i])
		}
	}
	return out
}

// TestFixtureLatentMoE checks Stable LatentMoE against the fixture at abs
// 1e-5 / rel 1e-4, and against an exact fp64 evaluation at 1e-6 / 1e-5.
//
// The fixture drives SiTU to its caps (hidden activations up to 100), so the
// fp32 reference that produced it carries rounding error of its own: on one
// of its 384 outputs (a small value left by cancelling ±2 branch outputs)
// it sits 1.5e-5 from the exact value, beyond its own stated tolerance, and
// no implementation of the published function can reach it. Such elements
// are identified by the exact evaluation, not by us; they must be few, and
// there we hold our output to the exact value instead.
func TestFixtureLatentMoE(t *testing.T) {
	f := loadFixture(t, "moe")
	got := runFixtureMoE(t, f)
	want := fixTensor(t, f, "out").Data
	exact := exactLatentMoE(t, f)
	fixtureOff := 0
	for i := range want {
		e := exact[i]
		if d := math.Abs(float64(got[i]) - e); d > 1e-6+1e-5*math.Abs(e) {
			t.Fatalf("element %d: %g, exact fp64 evaluation %g (diff %.3g)", i, got[i], e, d)
		}
		tol := fixAbs + fixRel*math.Abs(float64(want[i]))
		if math.Abs(float64(got[i])-float64(want[i])) <= tol {
			continue
		}
		if math.Abs(e-float64(want[i])) > tol {
			fixtureOff++
			t.Logf("element %d: fixture %.9g is %.3g from the exact %.9g (tolerance %.3g); ours %.9g", i, want[i], math.Abs(e-float64(want[i])), e, tol, got[i])
			continue
		}
		t.Fatalf("element %d: %g, fixture %g (tolerance %.3g)", i, got[i], want[i], tol)
	}
	if fixtureOff > 2 {
		t.Fatalf("%d fixture elements disagree with the exact evaluation; expected at most 2", fixtureOff)
	}
}
