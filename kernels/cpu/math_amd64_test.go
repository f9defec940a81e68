package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-inference/tandem/internal/expmath"
)

// mathInputs are exponent-uniform values of both signs over the ranges
// exp and tanh branch on, plus the probes.
func mathInputs(rng *rand.Rand, n int) []float64 {
	x := expmath.Probes()
	for len(x) < n/2 {
		x = append(x, -750+1462*rng.Float64()) // exp's whole finite range, subnormals included
	}
	for len(x) < n {
		v := math.Ldexp(1+rng.Float64(), rng.IntN(24)-14) // 2^-14 .. 2^10
		if rng.IntN(2) == 0 {
			v = -v
		}
		x = append(x, v)
	}
	return x[:n&^3]
}

// TestVecMathMatchesMath: the four-lane exp and tanh and the fused SiTU
// return the bits of exp and tanh (internal/expmath) on 2^18 inputs (probes included).
func TestVecMathMatchesMath(t *testing.T) {
	if archKernels() == nil || !vecMathCPU {
		t.Skip("no vector exp/tanh on this CPU")
	}
	if !vecMathOK {
		t.Error("the vector exp/tanh disagree with package math on the start-up probes: SiTU runs scalar")
	}
	rng := rand.New(rand.NewPCG(17, 18))
	x := mathInputs(rng, 1<<18)
	e, th := make([]float64, len(x)), make([]float64, len(x))
	expAVX2(&e[0], &x[0], len(x))
	tanhAVX2(&th[0], &x[0], len(x))
	for i, v := range x {
		if !sameFloat(e[i], expmath.Exp(v)) {
			t.Fatalf("expAVX2(%v) = %v (%#x), exp gives %v (%#x)", v, e[i], math.Float64bits(e[i]), expmath.Exp(v), math.Float64bits(expmath.Exp(v)))
		}
		if !sameFloat(th[i], expmath.Tanh(v)) {
			t.Fatalf("tanhAVX2(%v) = %v (%#x), tanh gives %v (%#x)", v, th[i], math.Float64bits(th[i]), expmath.Tanh(v), math.Float64bits(expmath.Tanh(v)))
		}
	}
	u := mathInputs(rng, len(x)+3)
	g := append([]float64(nil), x[:len(x)-1]...) // a ragged length: the scalar tail too
	want := append([]float64(nil), g...)
	situGo(want, u, 4, 25)
	situVec(g, u, 4, 25)
	for i := range g {
		if !sameFloat(g[i], want[i]) {
			t.Fatalf("situ(%v, %v) = %v, scalar %v", x[i], u[i], g[i], want[i])
		}
	}
}
