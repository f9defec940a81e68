package cpu

import (
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/internal/expmath"
	"github.com/tandem-inference/tandem/kernels"
)

// mlaKeyBlock is the number of cached rows expanded at a time; fixed
// absolute block boundaries keep a row's result independent of how the
// sequence was split into calls.
const mlaKeyBlock = 256

// cacheRowF32 decodes cache row s into dst.
func cacheRowF32(dst []float32, c kernels.LatentCache, s int) {
	if c.F32 != nil {
		copy(dst, c.F32[s*c.Cols:(s+1)*c.Cols])
		return
	}
	row := c.BF16[s*c.Cols : (s+1)*c.Cols]
	for i, v := range row {
		dst[i] = math.Float32frombits(uint32(v) << 16)
	}
}

// MLAAttention is gated NoPE MLA's attention core (spec §3.4).
func (b *Backend) MLAAttention(o, q *kernels.Tensor, span kernels.Span, cp *kernels.LatentCache, kvb *kernels.Matrix, heads, nope, rope, vdim int, scale float32, absorb bool) {
	cache := *cp
	lora := cache.Cols - rope
	n := span.Len()
	if q.Cols != heads*(nope+rope) || o.Cols != heads*vdim || kvb.Rows != heads*(nope+vdim) || kvb.Cols != lora || n > cache.Rows {
		panic(fmt.Sprintf("cpu.MLAAttention: q %v o %v kvb [%d,%d] cache [%d,%d] span %d, heads %d nope %d rope %d v %d",
			q, o, kvb.Rows, kvb.Cols, cache.Rows, cache.Cols, n, heads, nope, rope, vdim))
	}
	if absorb {
		b.mlaAbsorbed(o, q, span, cache, kvb, heads, nope, rope, vdim, scale)
		return
	}
	b.mlaExpanded(o, q, span, cache, kvb, heads, nope, rope, vdim, scale)
}

// mlaExpanded expands K_nope and V from the latent rows block by block and
// runs a causal online-softmax attention (memory O(block), not O(Tc)).
func (b *Backend) mlaExpanded(o, q *kernels.Tensor, span kernels.Span, cache kernels.LatentCache, kvb *kernels.Matrix, heads, nope, rope, vdim int, scale float32) {
	Tc, lora, n := cache.Rows, cache.Cols-rope, span.Len()
	first := Tc - n // absolute position of the span's first row
	hw := nope + vdim
	// Running softmax state per (row, head).
	mx := make([]float64, n*heads)
	sum := make([]float64, n*heads)
	acc := make([]float64, n*heads*vdim)
	for i := range mx {
		mx[i] = math.Inf(-1)
	}
	ckv := &kernels.Tensor{Cols: lora}
	kv := &kernels.Tensor{Cols: heads * hw}
	kpe := make([]float32, mlaKeyBlock*rope)
	row := make([]float32, cache.Cols)
	for s0 := 0; s0 < Tc; s0 += mlaKeyBlock {
		bn := min(mlaKeyBlock, Tc-s0)
		ckv.Rows, ckv.Data = bn, growF32(ckv.Data, bn*lora)
		kv.Rows, kv.Data = bn, growF32(kv.Data, bn*heads*hw)
		for s := 0; s < bn; s++ {
			cacheRowF32(row, cache, s0+s)
			copy(ckv.Data[s*lora:(s+1)*lora], row[:lora])
			copy(kpe[s*rope:(s+1)*rope], row[lora:])
		}
		b.MatMul(kv, ckv, kvb)
		// Rows that can see at least one key of this block.
		iLo := max(0, s0-first)
		work := (n - iLo) * heads
		b.parallel(work, max(1, b.grainFor(work)), func(lo, hi int) {
			sc := make([]float64, bn)
			for w := lo; w < hi; w++ {
				i, h := iLo+w/heads, w%heads
				p := first + i
				last := min(bn, p-s0+1)
				qr := q.Data[(span.Lo+i)*q.Cols+h*(nope+rope):][:nope+rope]
				m := mx[i*heads+h]
				for s := 0; s < last; s++ {
					kr := kv.Data[s*kv.Cols+h*hw:][:nope]
					var d float32
					for j, x := range kr {
						d += float32(qr[j] * x)
					}
					pe := kpe[s*rope : (s+1)*rope]
					for j, x := range pe {
						d += float32(qr[nope+j] * x)
					}
					sc[s] = float64(d) * float64(scale)
					m = math.Max(m, sc[s])
				}
				a := acc[(i*heads+h)*vdim:][:vdim]
				old := mx[i*heads+h]
				if m > old && !math.IsInf(old, -1) {
					f := expmath.Exp(old - m)
					sum[i*heads+h] *= f
					for j := range a {
						a[j] *= f
					}
				}
				mx[i*heads+h] = m
				for s := 0; s < last; s++ {
					e := expmath.Exp(sc[s] - m)
					sum[i*heads+h] += e
					vr := kv.Data[s*kv.Cols+h*hw+nope:][:vdim]
					for j, x := range vr {
						a[j] += float64(e * float64(x))
					}
				}
			}
		})
	}
	for i := 0; i < n; i++ {
		for h := 0; h < heads; h++ {
			a := acc[(i*heads+h)*vdim:][:vdim]
			inv := 1 / sum[i*heads+h]
			out := o.Data[(span.Lo+i)*o.Cols+h*vdim:][:vdim]
			for j := range out {
				out[j] = float32(a[j] * inv)
			}
		}
	}
}

// mlaAbsorbed folds kv_b_proj into the query and the output: per head,
// q_lat = W_kᵀ q_nope, score = (q_lat·c_kv + q_pe·k_pe)·scale over the
// latent rows, o = W_v (Σ p c_kv). Cost O(Tc·H·(lora+rope)) per row, the
// decode-time form.
func (b *Backend) mlaAbsorbed(o, q *kernels.Tensor, span kernels.Span, cache kernels.LatentCache, kvb *kernels.Matrix, heads, nope, rope, vdim int, scale float32) {
	Tc, lora, n := cache.Rows, cache.Cols-rope, span.Len()
	first := Tc - n
	hw := nope + vdim
	// Latent rows as fp32 once for all heads.
	lat := make([]float32, Tc*cache.Cols)
	for s := 0; s < Tc; s++ {
		cacheRowF32(lat[s*cache.Cols:(s+1)*cache.Cols], cache, s)
	}
	work := n * heads
	b.parallel(work, 1, func(lo, hi int) {
		wrow := make([]float32, lora)
		qlat := make([]float64, lora)
		olat := make([]float64, lora)
		sc := make([]float64, Tc)
		for w := lo; w < hi; w++ {
			i, h := w/heads, w%heads
			p := first + i
			qr := q.Data[(span.Lo+i)*q.Cols+h*(nope+rope):][:nope+rope]
			clear(qlat)
			for d := 0; d < nope; d++ {
				decodeRow(wrow, kvb, h*hw+d)
				qd := float64(qr[d])
				for l, x := range wrow {
					qlat[l] += float64(qd * float64(x))
				}
			}
			m := math.Inf(-1)
			for s := 0; s <= p; s++ {
				r := lat[s*cache.Cols:][:cache.Cols]
				var d float64
				for l := 0; l < lora; l++ {
					d += float64(qlat[l] * float64(r[l]))
				}
				for j := 0; j < rope; j++ {
					d += float64(float64(qr[nope+j]) * float64(r[lora+j]))
				}
				sc[s] = d * float64(scale)
				m = math.Max(m, sc[s])
			}
			var sum float64
			clear(olat)
			for s := 0; s <= p; s++ {
				e := expmath.Exp(sc[s] - m)
				sum += e
				r := lat[s*cache.Cols:][:lora]
				for l, x := range r {
					olat[l] += float64(e * float64(x))
				}
			}
			out := o.Data[(span.Lo+i)*o.Cols+h*vdim:][:vdim]
			for j := range out {
				decodeRow(wrow, kvb, h*hw+nope+j)
				var d float64
				for l, x := range wrow {
					d += float64(float64(x) * olat[l])
				}
				out[j] = float32(d / sum)
			}
		}
	})
}

func growF32(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
