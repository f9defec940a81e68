package cpu

import (
	"github.com/tandem-inference/tandem/internal/expmath"
	"github.com/tandem-inference/tandem/kernels"
)

// The elementwise ops as they were before their exp calls were vectorised,
// kept as references the current ops must match bit for bit
// (elementwise_test.go). Single-goroutine copies of the previous code.

func refShortConvSiLU(dst, x *kernels.Tensor, span kernels.Span, w *kernels.Tensor, tail []float32) {
	P, K := w.Rows, w.Cols
	n := span.Len()
	hist := make([]float32, K-1+n)
	for c := 0; c < P; c++ {
		copy(hist, tail[c*(K-1):(c+1)*(K-1)])
		for i := 0; i < n; i++ {
			hist[K-1+i] = x.Data[(span.Lo+i)*P+c]
		}
		wc := w.Data[c*K : (c+1)*K]
		for i := 0; i < n; i++ {
			var y float32
			for j := 0; j < K; j++ {
				y += float32(wc[j] * hist[i+j]) // rounded, as the op does: arm64 would fuse
			}
			dst.Data[(span.Lo+i)*P+c] = y * sigmoid(y)
		}
		copy(tail[c*(K-1):(c+1)*(K-1)], hist[n:n+K-1])
	}
}

func refKDAGate(z *kernels.Tensor, aLog []float32, headDim int, lower float32) {
	heads := z.Cols / headDim
	a := make([]float64, heads)
	for h := range a {
		a[h] = expmath.Exp(float64(aLog[h]))
	}
	for r := 0; r < z.Rows; r++ {
		row := z.Row(r)
		for i, v := range row {
			row[i] = lower * float32(1/(1+expmath.Exp(-a[i/headDim]*float64(v))))
		}
	}
}

func refMulSigmoid(x, gate *kernels.Tensor) {
	for i := range x.Data {
		x.Data[i] *= sigmoid(gate.Data[i])
	}
}

// stateT views a state array as the tensor the state ops take.
func stateT(s []float32) *kernels.Tensor { return &kernels.Tensor{Rows: 1, Cols: len(s), Data: s} }
