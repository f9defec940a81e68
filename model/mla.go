package model

import (
	"math"
	"time"

	"github.com/tandem-inference/tandem/kernels"
)

// mlaForward is gated NoPE MLA (spec §3.4) over normed input x. Each
// sequence's new latent rows (normalised c_kv then raw k_pe) are appended to
// its cache first, in the cache's dtype, and attention then reads the stored
// rows: prefill and decode see exactly the same cache.
func (m *Model) mlaForward(L int, w *MLAWeights, x *kernels.Tensor, b *Batch, phase Phase) *kernels.Tensor {
	be, c := m.Backend, m.Cfg
	T, H := x.Rows, w.QBProj.Rows/c.QHeadDim() // H: this holder's heads (all, or a tensor rank's)
	lat := c.LatentWidth()
	eps := float32(c.LatentNormEps)

	cq := m.linear(x, w.QAProj)
	be.RMSNorm(cq, cq, w.QANorm, 0, eps)
	q := m.linear(cq, w.QBProj) // [T, H*(nope+rope)]

	kv := m.linear(x, w.KVAProj) // [T, kv_lora + rope]
	// Normalise the c_kv columns only; k_pe stays raw (NoPE: never rotated).
	ckv := be.NewTensor(T, c.KVLoraRank)
	be.CopyBlock(ckv, 0, 0, kv, 0, 0, T, c.KVLoraRank)
	be.RMSNorm(ckv, ckv, w.KVANorm, 0, eps)
	be.CopyBlock(kv, 0, 0, ckv, 0, 0, T, c.KVLoraRank)
	free(be, cq, ckv)

	o := be.NewTensor(T, H*c.VHeadDim)
	scale := float32(1 / math.Sqrt(float64(c.QHeadDim())))
	pend := m.startVerify(L, b, phase)
	for i, s := range b.Seqs {
		span := b.Spans[i]
		part := s.Layers[L].Part(PartLatent)
		old := part.Shape[0]
		if lp := pend[i]; lp != nil {
			lp.latent = old // Commit cuts the cache back to the accepted rows
		}
		growLatent(part, span.Len(), lat)
		cache := &kernels.LatentCache{Rows: part.Shape[0], Cols: lat, F32: part.F32(), BF16: part.U16()}
		be.AttachLatent(cache, old)
		be.WriteLatent(cache, old, kv, span.Lo, span.Len())
		t0 := time.Now()
		be.MLAAttention(o, q, span, cache, w.KVBProj, H, c.QKNopeDim, c.QKRopeDim, c.VHeadDim, scale, phase == PhaseDecode)
		if b.Attention != nil && hostOps(be) {
			b.Attention[s] += time.Since(t0)
		}
		be.DetachLatent(cache, old)
	}
	free(be, q, kv)
	gate := m.linear(x, w.GProj)
	be.MulSigmoid(o, gate)
	be.Free(gate)
	y := m.linear(o, w.OProj)
	be.Free(o)
	return y
}

// growLatent makes room for n more rows (width w) at the end of an MLA
// cache part; the backend writes them (Ops.WriteLatent).
func growLatent(p *Part, n, w int) {
	p.Data = append(p.Data, make([]byte, n*w*p.DType.Size())...)
	p.Shape[0] += n
}

// hostOps reports whether be's ops run within the call: only then is the
// time around one its cost. A device backend queues them and returns.
func hostOps(be kernels.Backend) bool {
	_, dev := be.(kernels.DeviceMemory)
	return !dev
}
