package model

import (
	"math"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// mlaForward is gated NoPE MLA (spec §3.4) over normed input x. Each
// sequence's new latent rows (normalised c_kv then raw k_pe) are appended to
// its cache first, in the cache's dtype, and attention then reads the stored
// rows: prefill and decode see exactly the same cache.
func (m *Model) mlaForward(L int, w *MLAWeights, x *kernels.Tensor, b *Batch, phase Phase) *kernels.Tensor {
	be, c := m.Backend, m.Cfg
	T, H := x.Rows, c.MLAHeads
	lat := c.LatentWidth()
	eps := float32(c.LatentNormEps)

	cq := m.linear(x, w.QAProj)
	be.RMSNorm(cq, cq, w.QANorm, 0, eps)
	q := m.linear(cq, w.QBProj) // [T, H*(nope+rope)]

	kv := m.linear(x, w.KVAProj) // [T, kv_lora + rope]
	// Normalise the c_kv columns only; k_pe stays raw (NoPE: never rotated).
	ckv := be.NewTensor(T, c.KVLoraRank)
	for r := 0; r < T; r++ {
		copy(ckv.Row(r), kv.Row(r)[:c.KVLoraRank])
	}
	be.RMSNorm(ckv, ckv, w.KVANorm, 0, eps)
	for r := 0; r < T; r++ {
		copy(kv.Row(r)[:c.KVLoraRank], ckv.Row(r))
	}

	o := be.NewTensor(T, H*c.VHeadDim)
	scale := float32(1 / math.Sqrt(float64(c.QHeadDim())))
	for i, s := range b.Seqs {
		span := b.Spans[i]
		part := s.Layers[L].Part(PartLatent)
		appendLatentRows(part, kv.Data[span.Lo*lat:span.Hi*lat], lat)
		cache := kernels.LatentCache{Rows: part.Shape[0], Cols: lat, F32: part.F32(), BF16: part.U16()}
		be.MLAAttention(o, q, span, cache, w.KVBProj, H, c.QKNopeDim, c.QKRopeDim, c.VHeadDim, scale, phase == PhaseDecode)
	}
	be.MulSigmoid(o, m.linear(x, w.GProj))
	return m.linear(o, w.OProj)
}

// appendLatentRows appends rows (fp32, width w) to an MLA cache part,
// rounding to BF16 when the cache is BF16.
func appendLatentRows(p *Part, rows []float32, w int) {
	n := len(rows) / w
	switch p.DType {
	case F32:
		for _, v := range rows {
			p.Data = appendF32(p.Data, v)
		}
	case BF16:
		for _, v := range rows {
			u := mxfp.F32ToBF16(v)
			p.Data = append(p.Data, byte(u), byte(u>>8))
		}
	}
	p.Shape[0] += n
}

func appendF32(b []byte, v float32) []byte {
	u := math.Float32bits(v)
	return append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
}
