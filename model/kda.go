package model

import (
	"math"

	"github.com/tandem-inference/tandem/kernels"
)

// kdaForward is the KDA attention of spec §3.3 over normed input x: short
// convs, decay gate, delta-rule recurrence per sequence (chunked in
// prefill, recurrent in decode), per-head output norm and sigmoid gate, and
// the output projection. Each sequence continues from and updates its state.
func (m *Model) kdaForward(L int, w *KDAWeights, x *kernels.Tensor, b *Batch, phase Phase) *kernels.Tensor {
	be, c := m.Backend, m.Cfg
	T, P, H, D := x.Rows, c.KDAProjDim(), c.KDAHeads, c.KDAHeadDim

	proj := func(w *kernels.Matrix) *kernels.Tensor { return m.linear(x, w) }
	qp, kp, vp := proj(w.QProj), proj(w.KProj), proj(w.VProj)
	q, k, v := be.NewTensor(T, P), be.NewTensor(T, P), be.NewTensor(T, P)
	for i, s := range b.Seqs {
		ls := s.Layers[L]
		be.ShortConvSiLU(q, qp, b.Spans[i], w.QConv, ls.Part(PartConvQ).F32())
		be.ShortConvSiLU(k, kp, b.Spans[i], w.KConv, ls.Part(PartConvK).F32())
		be.ShortConvSiLU(v, vp, b.Spans[i], w.VConv, ls.Part(PartConvV).F32())
	}

	// Decay: z = W_fb (W_fa x) + dt_bias, g = g_min·σ(exp(A_log[h])·z).
	g := m.linear(proj(w.FAProj), w.FBProj)
	be.AddBias(g, w.DtBias)
	be.KDAGate(g, w.ALog, D, float32(c.GateLowerBound))
	beta := proj(w.BProj)
	be.Sigmoid(beta)

	be.L2NormGroups(q, D, float32(c.KDAQKNormEps), float32(1/math.Sqrt(float64(D))))
	be.L2NormGroups(k, D, float32(c.KDAQKNormEps), 1)

	o := be.NewTensor(T, P)
	chunk := KDAChunk
	if phase == PhaseDecode {
		chunk = 0
	}
	for i, s := range b.Seqs {
		S := s.Layers[L].Part(PartKDAState).F32()
		be.KDA(o, q, k, v, g, beta, b.Spans[i], S, H, D, D, chunk)
	}

	// ô = RMSNorm(o_h; o_norm) ⊙ σ(W_g x), then y = W_o ô.
	be.RMSNorm(o, o, w.ONorm, D, float32(c.KDAOutNormEps))
	be.MulSigmoid(o, proj(w.GProj))
	y := be.NewTensor(T, c.HiddenSize)
	be.MatMul(y, o, w.OProj)
	return y
}
