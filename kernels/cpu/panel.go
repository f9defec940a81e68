package cpu

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// gemmScratch is one worker's packing buffers, reused across calls through
// scratchPool so that a decode step allocates nothing per matrix.
type gemmScratch struct {
	wp   []float32 // [panelK][groupW] packed weight panel
	rows []float32 // weight rows decoded to fp32: [packW][panelK] or [gemvRows][gemvK]
	c    []float64 // [rows][groupW] accumulators
	xp   []float64 // packed activations (serial callers)
	f64  []float64 // fp64 intermediates of fused ops (serial callers)
	f64b []float64
	f32  []float32         // gathered expert rows
	y    []float64         // expert outputs
	acc  [gemvRows]float64 // one-row kernel accumulators
}

var scratchPool = sync.Pool{New: func() any {
	return &gemmScratch{
		wp:   make([]float32, panelK*groupW),
		rows: make([]float32, packW*panelK),
	}
}}

func getScratch() *gemmScratch  { return scratchPool.Get().(*gemmScratch) }
func putScratch(s *gemmScratch) { scratchPool.Put(s) }
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

func unsafeSlice[T any](p *T, n int) []T { return unsafe.Slice(p, n) }

// paddedRows is the number of accumulator and packed-activation rows that
// n rows occupy once the last tile is rounded up (tileRows).
func paddedRows(n int) int {
	p := 0
	for p < n {
		p += tileRows(n - p)
	}
	return p
}

// packedLen is the length packX needs for n rows of I values.
func packedLen(n, I int) int {
	if n == 1 {
		return 4 * I
	}
	return paddedRows(n) * I
}

// packX writes the n rows of x [n, I] as activation tiles into xp
// [packedLen(n, I)]; rows that pad the last tile are zero. A single row is
// written broadcast four-wide for the one-row kernels: xp[4k+l] = x[k].
func packX[X float](xp []float64, x []X, n, I int) {
	x = x[:n*I]
	if n == 1 {
		for k, v := range x {
			f := float64(v)
			xp[4*k], xp[4*k+1], xp[4*k+2], xp[4*k+3] = f, f, f, f
		}
		return
	}
	for t0 := 0; t0 < n; {
		mr := tileRows(n - t0)
		tile := xp[t0*I : (t0+mr)*I]
		for i := 0; i < mr; i++ {
			if t0+i >= n {
				for k := 0; k < I; k++ {
					tile[k*mr+i] = 0
				}
				continue
			}
			row := x[(t0+i)*I:][:I]
			for k, v := range row {
				tile[k*mr+i] = float64(v)
			}
		}
		t0 += mr
	}
}

// packWeights fills s.wp with the panel of output columns [o0, o0+groupW)
// and k in [k0, k0+kc): weight rows past w.Rows pack as zeros.
func packWeights(kn *kernelSet, s *gemmScratch, w *kernels.Matrix, o0, k0, kc int) {
	I := w.Cols
	k8 := kc &^ 7
	for g := 0; g < groupW; g += packW {
		dst := s.wp[g:]
		r0 := o0 + g
		nr := min(packW, w.Rows-r0)
		if nr <= 0 {
			for kk := 0; kk < kc; kk++ {
				clear(dst[kk*groupW:][:packW])
			}
			continue
		}
		var src []float32 // packW fp32 rows, lds apart
		lds := I
		switch {
		case w.Format == kernels.F32 && nr == packW:
			src = f32view(w.Data)[r0*I+k0:]
		case w.Format == kernels.BF16 && nr == packW:
			rows := u16view(w.Data)[r0*I+k0:]
			if k8 > 0 {
				kn.packBF16(&dst[0], &rows[0], I, k8)
			}
			for kk := k8; kk < kc; kk++ {
				for j := 0; j < packW; j++ {
					dst[kk*groupW+j] = bf16(rows[j*I+kk])
				}
			}
			continue
		case w.Format == kernels.MXFP4 && nr == packW && kn.mxfp4Panel != nil:
			sb := I / kernels.MXBlock
			nb := kc / kernels.MXBlock
			kn.mxfp4Panel(&dst[0], w.Data[r0*I/2+k0/2:], I/2, w.Scales[r0*sb+k0/kernels.MXBlock:], sb, nb)
			continue
		default:
			lds = panelK
			src = s.rows
			for j := 0; j < packW; j++ {
				row := s.rows[j*lds:][:kc]
				if j < nr {
					decodeSegment(kn, row, w, r0+j, k0)
				} else {
					clear(row)
				}
			}
		}
		if k8 > 0 {
			kn.packF32(&dst[0], &src[0], lds, k8)
		}
		for kk := k8; kk < kc; kk++ {
			for j := 0; j < packW; j++ {
				dst[kk*groupW+j] = src[j*lds+kk]
			}
		}
	}
}

// decodeSegment writes W[r][k0:k0+len(dst)] as fp32 (exact for every
// format: MX elements times their power-of-two scale, as mxfp decodes them).
func decodeSegment(kn *kernelSet, dst []float32, w *kernels.Matrix, r, k0 int) {
	I, n := w.Cols, len(dst)
	switch w.Format {
	case kernels.F32:
		copy(dst, f32view(w.Data)[r*I+k0:][:n])
	case kernels.BF16:
		for i, v := range u16view(w.Data)[r*I+k0:][:n] {
			dst[i] = bf16(v)
		}
	case kernels.F16:
		for i, v := range u16view(w.Data)[r*I+k0:][:n] {
			dst[i] = mxfp.F16ToF32(v)
		}
	case kernels.MXFP4, kernels.MXFP8E4M3, kernels.MXFP8E5M2:
		// Segments start and end on block boundaries (panelK and I are
		// multiples of MXBlock).
		sb := I / kernels.MXBlock
		scales := w.Scales[r*sb+k0/kernels.MXBlock:][:n/kernels.MXBlock]
		if w.Format == kernels.MXFP4 {
			kn.mxfp4(dst, w.Data[r*I/2+k0/2:][:n/2], scales)
		} else {
			mxfp.DequantMXFP8(dst, w.Data[r*I+k0:][:n], scales, w.Format == kernels.MXFP8E5M2)
		}
	default:
		panic(fmt.Sprintf("cpu: weight %s has unknown format %s", w.Name, w.Format))
	}
}

func dequantMXFP4(dst []float32, packed, scales []byte) { mxfp.DequantMXFP4(dst, packed, scales) }
