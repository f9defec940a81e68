package vision

import (
	"github.com/tandem-inference/tandem/internal/expmath"
	"math"

	"github.com/tandem-inference/tandem/kernels"
)

// Encoder block, pre-norm, no biases:
//
//	x += wo(attention(norm0(x)))
//	x += fc1(gelu_tanh(fc0(norm1(x))))
//
// with RMSNorm weights norm0 and norm1 (eps: Config.NormEps).

// block runs encoder block i over the packed rows x [N, Hidden] in place.
func (t *Tower) block(i int, x *kernels.Tensor, segs []segment) error {
	c, be, w := t.cfg, t.be, &t.w.Blocks[i]
	n := x.Rows
	h := be.NewTensor(n, c.Hidden)
	defer be.Free(h)
	be.RMSNorm(h, x, w.Norm0, 0, c.NormEps)
	qkv := be.NewTensor(n, 3*c.QKV)
	be.MatMul(qkv, h, w.WQKV)
	vals := download(be, qkv)
	be.Free(qkv)
	o, err := t.attention(vals, segs)
	if err != nil {
		return err
	}
	ot := upload(be, o, n, c.QKV)
	be.MatMul(h, ot, w.WO)
	be.Free(ot)
	be.Add(x, x, h)

	be.RMSNorm(h, x, w.Norm1, 0, c.NormEps)
	mid := be.NewTensor(n, c.Intermediate)
	defer be.Free(mid)
	be.MatMul(mid, h, w.FC0)
	hostMap(be, mid, geluTanh)
	be.MatMul(h, mid, w.FC1)
	be.Add(x, x, h)
	return nil
}

// hostMap applies f to every value of t on the host (the Backend has no
// GELU op).
func hostMap(be kernels.Backend, t *kernels.Tensor, f func(float32) float32) {
	v := download(be, t)
	parallelRows(be.Threads(), len(v), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			v[i] = f(v[i])
		}
	})
	be.Upload(t, v)
}

// geluTanh is GELU with the tanh approximation (PyTorch's
// approximate="tanh", the encoder MLP's activation), in fp64 inside.
func geluTanh(x float32) float32 {
	v := float64(x)
	inner := math.Sqrt(2/math.Pi) * float64(v+float64(0.044715*v*v*v))
	return float32(0.5 * v * (1 + expmath.Tanh(inner)))
}

// geluErf is exact GELU, x·Φ(x) (PyTorch's nn.GELU default, the
// projector's activation), in fp64 inside.
func geluErf(x float32) float32 {
	v := float64(x)
	return float32(0.5 * v * (1 + erf(v/math.Sqrt2)))
}
