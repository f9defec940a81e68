package model

import "github.com/tandem-inference/tandem/kernels"

// moeForward is Stable LatentMoE (spec §3.6): the router reads the full
// width x; experts run in the latent z = W_down x; their weighted sum is
// normalised as an aggregate and projected back up; the shared experts read
// x and are added unweighted.
func (m *Model) moeForward(w *MoEWeights, x *kernels.Tensor) *kernels.Tensor {
	be, c := m.Backend, m.Cfg
	T, k := x.Rows, c.TopK
	logits := m.linear(x, w.Router)
	ids := make([]int32, T*k)
	weights := make([]float32, T*k)
	be.RouterTopK(logits, w.RouterBias, k, c.Renormalize, float32(c.RoutedScale), ids, weights)

	be.Free(logits)
	z := m.linear(x, w.LatentDown)
	u := be.NewTensor(T, c.LatentDim)
	be.RoutedExperts(u, z, ids, weights, k, w.Experts, float32(c.SiTUBeta1), float32(c.SiTUBeta2))
	be.Free(z)
	if c.LatentMoENorm {
		be.RMSNorm(u, u, w.LatentNorm, 0, float32(c.RoutedNormEps))
	}
	y := m.linear(u, w.LatentUp)
	be.Free(u)
	if w.Shared != nil {
		s := m.ffnForward(w.Shared, x)
		be.Add(y, y, s)
		be.Free(s)
	}
	return y
}
