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
	T, H, D := x.Rows, w.BProj.Rows, c.KDAHeadDim // H: this holder's heads (all, or a tensor rank's)
	P := H * D

	proj := func(w *kernels.Matrix) *kernels.Tensor { return m.linear(x, w) }
	qp, kp, vp := proj(w.QProj), proj(w.KProj), proj(w.VProj)
	q, k, v := be.NewTensor(T, P), be.NewTensor(T, P), be.NewTensor(T, P)
	pend := m.startVerify(L, b, phase)
	for i, s := range b.Seqs {
		m.kdaConvs(s.Layers[L], w, b.Spans[i], pend[i], [3]*kernels.Tensor{q, k, v}, [3]*kernels.Tensor{qp, kp, vp})
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
		sp, host := b.Spans[i], s.Layers[L].Part(PartKDAState).F32()
		var sc *[]float32
		if lp := pend[i]; lp != nil {
			// A verify span: keep its delta-rule inputs for Commit and
			// run on a copy of S.
			n := sp.Len()
			lp.k, lp.v, lp.g, lp.beta = m.keepRows(k, sp.Lo, n), m.keepRows(v, sp.Lo, n), m.keepRows(g, sp.Lo, n), m.keepRows(beta, sp.Lo, n)
			sc = scratch(host)
			host = *sc
		}
		S := be.AttachState(host, H*D, D)
		be.KDA(o, q, k, v, g, beta, sp, S, H, D, D, chunk)
		be.DetachState(S, host)
		if sc != nil {
			putScratch(sc)
		}
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

// kdaConvs runs the three short convs of one sequence's rows, continuing
// from and updating its conv tails; a verify span (lp not nil) keeps its
// pre-conv inputs for Commit and runs on copies of the tails.
func (m *Model) kdaConvs(ls *LayerState, w *KDAWeights, span kernels.Span, lp *layerPending, dst, src [3]*kernels.Tensor) {
	be, P, K1 := m.Backend, w.QConv.Rows, w.QConv.Cols-1
	for j, cw := range []*kernels.Tensor{w.QConv, w.KConv, w.VConv} {
		host := ls.Part(PartConvQ + PartKind(j)).F32()
		var sc *[]float32
		if lp != nil {
			lp.conv[j] = m.keepRows(src[j], span.Lo, span.Len())
			sc = scratch(host)
			host = *sc
		}
		tail := be.AttachState(host, P, K1)
		be.ShortConvSiLU(dst[j], src[j], span, cw, tail)
		be.DetachState(tail, host)
		if sc != nil {
			putScratch(sc)
		}
	}
}

// free returns temporaries to the backend.
func free(be kernels.Backend, ts ...*kernels.Tensor) {
	for _, t := range ts {
		be.Free(t)
	}
}
