package cpu

import (
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/kernels"
)

// float is the element type of GEMM operands: activations are fp32 between
// ops, fp64 inside fused ops (SiTU MLPs) that round only once at the end.
type float interface{ ~float32 | ~float64 }

// blockT is the number of activation rows packed at a time (a multiple of
// the 6-row tile).
const blockT = 96

// MatMul computes dst[T, O] = x[T, I] · Wᵀ for W [O, I] in any storage
// format. Each output is one fp64 accumulator updated by
// acc = fma(x[k], w[k], acc) for k = 0..I-1 from acc = 0, with x[k] and
// w[k] widened exactly, then rounded once to the output type. The result
// therefore does not depend on T, on where a row falls in a tile, on the
// thread count or on the other rows of the batch, and amd64 and arm64 agree
// bit for bit; docs/ARCHITECTURE.md, "Numerics and exactness", says what
// relies on that.
func (b *Backend) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) {
	if x.Cols != w.Cols || dst.Rows != x.Rows || dst.Cols != w.Rows {
		panic(fmt.Sprintf("cpu.MatMul: x %v · %s[%d,%d]ᵀ -> dst %v", x, w.Name, w.Rows, w.Cols, dst))
	}
	// The work is blocked so that no weight is decoded more than once per 96
	// rows of x and nothing is dequantized as a whole: per group of 32 output
	// columns, 128 values of k of the group's weight rows are decoded into a
	// k-major fp64 panel, and tile kernels, SIMD assembly where available,
	// vectorise across the 32 columns, never across k (tile.go).
	gemm(b, dst.Data, x.Data, x.Rows, w)
}

// gemm is MatMul over raw slices of either precision, parallel over column
// groups.
func gemm[X, Y float](b *Backend, dst []Y, x []X, T int, w *kernels.Matrix) {
	I, O := w.Cols, w.Rows
	groups := (O + groupW - 1) / groupW
	kn := kernelsInUse
	xs := getScratch()
	defer putScratch(xs)
	for t0 := 0; t0 < T; t0 += blockT {
		n := min(blockT, T-t0)
		xs.xp = grow(xs.xp, packedLen(n, I))
		xp := xs.xp
		packX(xp, x[t0*I:], n, I)
		out := dst[t0*O : (t0+n)*O]
		b.parallel(groups, max(1, b.grainFor(groups)), func(lo, hi int) {
			s := getScratch()
			for g := lo; g < hi; g++ {
				gemmGroup(kn, out, xp, n, w, g, s)
			}
			putScratch(s)
		})
	}
}

// gemmSerial is gemm on the calling goroutine (for ops that already run in
// parallel at a coarser level, such as one expert per worker).
func gemmSerial[X, Y float](dst []Y, x []X, T int, w *kernels.Matrix, s *gemmScratch) {
	I, O := w.Cols, w.Rows
	groups := (O + groupW - 1) / groupW
	kn := kernelsInUse
	for t0 := 0; t0 < T; t0 += blockT {
		n := min(blockT, T-t0)
		s.xp = grow(s.xp, packedLen(n, I))
		packX(s.xp, x[t0*I:], n, I)
		for g := 0; g < groups; g++ {
			gemmGroup(kn, dst[t0*O:(t0+n)*O], s.xp, n, w, g, s)
		}
	}
}

// gemmGroup computes output columns [32g, 32g+32) of the n packed rows xp.
func gemmGroup[Y float](kn *kernelSet, dst []Y, xp []float64, n int, w *kernels.Matrix, g int, s *gemmScratch) {
	if n == 1 {
		gemvGroup(kn, dst, xp, w, g, s)
		return
	}
	I, O := w.Cols, w.Rows
	o0 := g * groupW
	cols := min(groupW, O-o0)
	s.c = grow(s.c, paddedRows(n)*groupW)
	c := s.c
	clear(c)
	for k0 := 0; k0 < I; k0 += panelK {
		kc := min(panelK, I-k0)
		packWeights(kn, s, w, o0, k0, kc)
		for t0 := 0; t0 < n; {
			mr := tileRows(n - t0)
			kn.runTile(mr, cols, c[t0*groupW:], xp[t0*I+k0*mr:], s.wp, kc)
			t0 += mr
		}
	}
	for t := 0; t < n; t++ {
		out := dst[t*O+o0:][:cols]
		for j, v := range c[t*groupW:][:cols] {
			out[j] = Y(v)
		}
	}
}

// gemvGroup is gemmGroup for one row (decode steps, most routed experts):
// every weight is used once, so instead of packing a panel the kernel
// transposes 16 weight rows in registers and feeds its FMAs directly;
// xb is the row broadcast four-wide (packX).
func gemvGroup[Y float](kn *kernelSet, dst []Y, xb []float64, w *kernels.Matrix, g int, s *gemmScratch) {
	I, O := w.Cols, w.Rows
	for r0 := g * groupW; r0 < min(O, (g+1)*groupW); r0 += gemvRows {
		nr := min(gemvRows, O-r0)
		acc := &s.acc
		*acc = [gemvRows]float64{}
		if w.Format == kernels.MXFP4 && nr == gemvRows && kn.mxfp4Gemv != nil {
			sb := I / kernels.MXBlock
			kn.mxfp4Gemv(acc, xb, w.Data[r0*I/2:], I/2, w.Scales[r0*sb:], sb, sb)
		} else if w.Format == kernels.BF16 && nr == gemvRows {
			// Straight from the weight bytes, whole rows at once.
			rows := u16view(w.Data)[r0*I:]
			k16 := I &^ 15
			if k16 > 0 {
				kn.gemvBF16(acc, &xb[0], &rows[0], I, k16)
			}
			for r := range acc {
				for k := k16; k < I; k++ {
					acc[r] = math.FMA(xb[4*k], float64(bf16(rows[r*I+k])), acc[r])
				}
			}
		} else {
			for k0 := 0; k0 < I; k0 += gemvK {
				kc := min(gemvK, I-k0)
				var rows []float32
				lds := I
				if w.Format == kernels.F32 && nr == gemvRows {
					rows = f32view(w.Data)[r0*I+k0:]
				} else {
					lds = gemvK
					s.rows = grow(s.rows, max(len(s.rows), gemvRows*gemvK))
					rows = s.rows
					for r := 0; r < gemvRows; r++ {
						seg := rows[r*lds:][:kc]
						if r < nr {
							decodeSegment(kn, seg, w, r0+r, k0)
						} else {
							clear(seg)
						}
					}
				}
				k8 := kc &^ 7
				if k8 > 0 {
					kn.gemvF32(acc, &xb[4*k0], &rows[0], lds, k8)
				}
				for r := range acc {
					for k := k8; k < kc; k++ {
						acc[r] = math.FMA(xb[4*(k0+k)], float64(rows[r*lds+k]), acc[r])
					}
				}
			}
		}
		out := dst[r0:][:nr]
		for r := range out {
			out[r] = Y(acc[r])
		}
	}
}
