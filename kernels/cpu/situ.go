package cpu

import (
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
)

// SiTUMLP is the fused SiTU-GLU MLP; see kernels.Backend.
func (b *Backend) SiTUMLP(dst, x *kernels.Tensor, gate, up, down *kernels.Matrix, beta1, beta2 float32) {
	T, d, inter := x.Rows, x.Cols, gate.Rows
	if gate.Cols != d || up.Cols != d || up.Rows != inter || down.Cols != inter || dst.Rows != T || dst.Cols != down.Rows {
		panic(fmt.Sprintf("cpu.SiTUMLP: x %v, gate [%d,%d], up [%d,%d], down [%d,%d], dst %v", x, gate.Rows, gate.Cols, up.Rows, up.Cols, down.Rows, down.Cols, dst))
	}
	gb, ub := getF64(T*inter), getF64(T*inter)
	defer f64Pool.Put(gb)
	defer f64Pool.Put(ub)
	g, u := *gb, *ub
	gemm(b, g, x.Data, T, gate)
	gemm(b, u, x.Data, T, up)
	b.parallel(len(g), max(4096, b.grainFor(len(g))), func(lo, hi int) {
		situInPlace(g[lo:hi], u[lo:hi], beta1, beta2)
	})
	gemm(b, dst.Data, g, T, down)
}

// situMLPSerial is SiTUMLP on the calling goroutine with fp64 output (one
// routed expert over its rows); the hidden activations live in s.
func situMLPSerial(dst []float64, x []float32, T int, e kernels.Expert, beta1, beta2 float32, s *gemmScratch) {
	inter := e.W1.Rows
	s.f64 = grow(s.f64, T*inter)
	s.f64b = grow(s.f64b, T*inter)
	g, u := s.f64, s.f64b
	gemmSerial(g, x, T, e.W1, s)
	gemmSerial(u, x, T, e.W3, s)
	situInPlace(g, u, beta1, beta2)
	gemmSerial(dst, g, T, e.W2, s)
}

func situInPlace(g, u []float64, beta1, beta2 float32) {
	kernelsInUse.situ(g, u, float64(beta1), float64(beta2))
}

// situGo is SiTU over a vector with the scalar functions.
func situGo(g, u []float64, b1, b2 float64) {
	u = u[:len(g)]
	for i := range g {
		g[i] = situ(g[i], u[i], b1, b2)
	}
}
