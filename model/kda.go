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
	K1 := w.QConv.Cols - 1
	for i, s := range b.Seqs {
		ls := s.Layers[L]
		for _, c := range []struct {
			dst, src, w *kernels.Tensor
			part        PartKind
		}{{q, qp, w.QConv, PartConvQ}, {k, kp, w.KConv, PartConvK}, {v, vp, w.VConv, PartConvV}} {
			host := ls.Part(c.part).F32()
			tail := be.AttachState(host, P, K1)
			be.ShortConvSiLU(c.dst, c.src, b.Spans[i], c.w, tail)
			be.DetachState(tail, host)
		}
	}
	free(be, qp, kp, vp)

	// Decay: z = W_fb (W_fa x) + dt_bias, g = g_min·σ(exp(A_log[h])·z).
	fa := proj(w.FAProj)
	g := m.linear(fa, w.FBProj)
	be.Free(fa)
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
		host := s.Layers[L].Part(PartKDAState).F32()
		S := be.AttachState(host, H*D, D)
		be.KDA(o, q, k, v, g, beta, b.Spans[i], S, H, D, D, chunk)
		be.DetachState(S, host)
	}
	free(be, q, k, v, g, beta)

	// ô = RMSNorm(o_h; o_norm) ⊙ σ(W_g x), then y = W_o ô.
	be.RMSNorm(o, o, w.ONorm, D, float32(c.KDAOutNormEps))
	gate := proj(w.GProj)
	be.MulSigmoid(o, gate)
	be.Free(gate)
	y := be.NewTensor(T, c.HiddenSize)
	be.MatMul(y, o, w.OProj)
	be.Free(o)
	return y
}

// free returns temporaries to the backend.
func free(be kernels.Backend, ts ...*kernels.Tensor) {
	for _, t := range ts {
		be.Free(t)
	}
}
