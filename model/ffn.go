package model

import "github.com/tandem-inference/tandem/kernels"

// ffnForward is a SiTU-GLU MLP, W_down · SiTU(W_gate x, W_up x) (spec §3.5):
// the dense FFN of the first layers and the shared experts.
func (m *Model) ffnForward(w *FFNWeights, x *kernels.Tensor) *kernels.Tensor {
	y := m.Backend.NewTensor(x.Rows, w.DownProj.Rows)
	m.Backend.SiTUMLP(y, x, w.GateProj, w.UpProj, w.DownProj, float32(m.Cfg.SiTUBeta1), float32(m.Cfg.SiTUBeta2))
	return y
}

// linear is y = x Wᵀ.
func (m *Model) linear(x *kernels.Tensor, w *kernels.Matrix) *kernels.Tensor {
	y := m.Backend.NewTensor(x.Rows, w.Rows)
	m.Backend.MatMul(y, x, w)
	return y
}
