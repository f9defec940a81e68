package model

import "github.com/tandem-inference/tandem/kernels"

// attnResMix is Block Attention Residuals' depth mix (spec §3.2): a softmax
// over the completed blocks and the current partial sum, per token, scored
// by the RMS-normalised source against the folded norm ⊙ projection vector.
func (m *Model) attnResMix(partial *kernels.Tensor, stack []*kernels.Tensor, proj []float32) *kernels.Tensor {
	sources := make([]*kernels.Tensor, 0, len(stack)+1)
	sources = append(sources, stack...)
	sources = append(sources, partial)
	out := m.Backend.NewTensor(partial.Rows, partial.Cols)
	m.Backend.AttnResMix(out, sources, proj, float32(m.Cfg.AttnResEps))
	return out
}
