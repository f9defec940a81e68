package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-inference/tandem/kernels"
)

// wide draws fp32 values over many binades, with exact zeros.
func wide(rng *rand.Rand) float64 {
	if rng.IntN(50) == 0 {
		return 0
	}
	return rng.NormFloat64() * math.Pow(2, float64(rng.IntN(16)-6))
}

// TestElementwiseMatchesReference: ShortConvSiLU (spans mid-tensor, state
// carried, in place), KDAGate, MulSigmoid and Sigmoid give the bits of the
// code they replaced, with every kernel set and 1 and 3 threads.
func TestElementwiseMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	for _, kn := range kernelSets() {
		useKernels(t, kn)
		for _, threads := range []int{1, 3} {
			b := New(threads)
			for _, sh := range []struct{ P, K, T int }{{70, 4, 9}, {13, 4, 1}, {200, 2, 3}, {64, 1, 5}, {9, 5, 1}} {
				name := fmt.Sprintf("%s/threads%d/P%d_K%d_T%d", kn.name, threads, sh.P, sh.K, sh.T)
				w := randTensor(rng, sh.P, sh.K, func() float64 { return wide(rng) })
				x := randTensor(rng, sh.T+2, sh.P, func() float64 { return wide(rng) })
				tail0 := make([]float32, sh.P*(sh.K-1))
				for i := range tail0 {
					tail0[i] = float32(wide(rng))
				}
				span := kernels.Span{Lo: 1, Hi: 1 + sh.T}
				want := b.NewTensor(sh.T+2, sh.P)
				wantTail := append([]float32(nil), tail0...)
				refShortConvSiLU(want, x, span, w, wantTail)
				got := b.NewTensor(sh.T+2, sh.P)
				tail := append([]float32(nil), tail0...)
				b.ShortConvSiLU(got, x, span, w, stateT(tail))
				if i := sameF32(got.Data, want.Data); i >= 0 {
					t.Fatalf("%s ShortConvSiLU: out %d = %g, want %g", name, i, got.Data[i], want.Data[i])
				}
				if i := sameF32(tail, wantTail); i >= 0 {
					t.Fatalf("%s ShortConvSiLU: tail %d = %g, want %g", name, i, tail[i], wantTail[i])
				}
				// In place, continuing from the state just written.
				in := &kernels.Tensor{Rows: x.Rows, Cols: x.Cols, Data: append([]float32(nil), x.Data...)}
				refShortConvSiLU(want, x, span, w, wantTail)
				b.ShortConvSiLU(in, in, span, w, stateT(tail))
				if i := sameF32(in.Data[span.Lo*sh.P:span.Hi*sh.P], want.Data[span.Lo*sh.P:span.Hi*sh.P]); i >= 0 {
					t.Fatalf("%s ShortConvSiLU in place: out %d differs", name, i)
				}
				if i := sameF32(tail, wantTail); i >= 0 {
					t.Fatalf("%s ShortConvSiLU in place: tail %d differs", name, i)
				}
			}
			// KDAGate over several heads, MulSigmoid, Sigmoid.
			const heads, hd = 3, 37
			aLog := []float32{-1.5, 0.25, 2}
			z := randTensor(rng, 5, heads*hd, func() float64 { return wide(rng) })
			zw := &kernels.Tensor{Rows: z.Rows, Cols: z.Cols, Data: append([]float32(nil), z.Data...)}
			refKDAGate(zw, aLog, hd, -5)
			b.KDAGate(z, aLog, hd, -5)
			if i := sameF32(z.Data, zw.Data); i >= 0 {
				t.Fatalf("%s KDAGate: %d = %g, want %g", kn.name, i, z.Data[i], zw.Data[i])
			}
			x := randTensor(rng, 3, 5000, func() float64 { return wide(rng) })
			g := randTensor(rng, 3, 5000, func() float64 { return wide(rng) })
			g.Data[0], g.Data[1], g.Data[2] = float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())
			xw := &kernels.Tensor{Rows: 3, Cols: 5000, Data: append([]float32(nil), x.Data...)}
			refMulSigmoid(xw, g)
			b.MulSigmoid(x, g)
			for i := range x.Data {
				if math.Float32bits(x.Data[i]) != math.Float32bits(xw.Data[i]) && !(x.Data[i] != x.Data[i] && xw.Data[i] != xw.Data[i]) {
					t.Fatalf("%s MulSigmoid: %d = %g, want %g", kn.name, i, x.Data[i], xw.Data[i])
				}
			}
			s := &kernels.Tensor{Rows: 3, Cols: 5000, Data: append([]float32(nil), g.Data...)}
			b.Sigmoid(s)
			for i, v := range g.Data {
				if want := sigmoid(v); math.Float32bits(s.Data[i]) != math.Float32bits(want) && !(want != want && s.Data[i] != s.Data[i]) {
					t.Fatalf("%s Sigmoid(%g) = %g, want %g", kn.name, v, s.Data[i], want)
				}
			}
		}
	}
}
