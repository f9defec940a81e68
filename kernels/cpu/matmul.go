package cpu

import (
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/kernels"
)

// float is the element type of GEMM operands: activations are fp32 between
// ops, fp64 inside fused ops (SiTU MLPs) that round only once at the end.
type float interface{ ~float32 | ~float64 }

const (
	tileO  = 4  // weight rows decoded and used together
	blockT = 64 // activation rows converted to fp64 at a time
)

// MatMul computes dst[T, O] = x[T, I] · Wᵀ for W [O, I] in any storage
// format.
//
// Weight rows are decoded four at a time into a small per-worker scratch
// (never the whole matrix) and each decoded tile serves a block of 64 rows
// of x. Every output is one fp64 accumulator updated with a fused
// multiply-add, acc = fma(x[k], w[k], acc), sequentially over k, whatever T
// is and wherever the row falls in a tile (explicit FMA also makes amd64 and
// arm64 agree bit for bit, where Go would otherwise fuse only on arm64):
// a sequence's results do not depend on which other sequences share the
// batch. Batched passes, super-chunks and decode steps rely on that for
// bit-identical states, and fp64 accumulation keeps the reference within
// the fixtures' 1e-5 on activations of magnitude ~100 (SiTU's cap).
func (b *Backend) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) {
	if x.Cols != w.Cols || dst.Rows != x.Rows || dst.Cols != w.Rows {
		panic(fmt.Sprintf("cpu.MatMul: x %v · %s[%d,%d]ᵀ -> dst %v", x, w.Name, w.Rows, w.Cols, dst))
	}
	gemm(b, dst.Data, x.Data, x.Rows, w)
}

// gemm is MatMul over raw slices of either precision, parallel over weight
// tiles.
func gemm[X, Y float](b *Backend, dst []Y, x []X, T int, w *kernels.Matrix) {
	I, O := w.Cols, w.Rows
	tiles := (O + tileO - 1) / tileO
	xb := make([]float64, min(T, blockT)*I)
	for t0 := 0; t0 < T; t0 += blockT {
		n := min(blockT, T-t0)
		toF64(xb[:n*I], x[t0*I:(t0+n)*I])
		b.parallel(tiles, max(1, b.grainFor(tiles)), func(lo, hi int) {
			s := newGemmScratch(I)
			gemmTiles(dst[t0*O:(t0+n)*O], xb[:n*I], n, w, lo, hi, s)
		})
	}
}

// gemmSerial is gemm on the calling goroutine (for ops that already run in
// parallel at a coarser level, such as one expert per worker).
func gemmSerial[X, Y float](dst []Y, x []X, T int, w *kernels.Matrix, s *gemmScratch) {
	I := w.Cols
	tiles := (w.Rows + tileO - 1) / tileO
	xb := s.xblock(min(T, blockT) * I)
	for t0 := 0; t0 < T; t0 += blockT {
		n := min(blockT, T-t0)
		toF64(xb[:n*I], x[t0*I:(t0+n)*I])
		gemmTiles(dst[t0*w.Rows:(t0+n)*w.Rows], xb[:n*I], n, w, 0, tiles, s)
	}
}

// gemmScratch is one worker's decode buffers.
type gemmScratch struct {
	row []float32 // one decoded weight row
	w   []float64 // tileO decoded rows in fp64
	x   []float64 // an fp64 block of activations (serial use only)
}

func newGemmScratch(I int) *gemmScratch {
	return &gemmScratch{row: make([]float32, I), w: make([]float64, tileO*I)}
}

func (s *gemmScratch) xblock(n int) []float64 {
	if cap(s.x) < n {
		s.x = make([]float64, n)
	}
	return s.x[:n]
}

func toF64[X float](dst []float64, src []X) {
	src = src[:len(dst)]
	for i, v := range src {
		dst[i] = float64(v)
	}
}

// gemmTiles computes output tiles [lo, hi) (four columns each) for the n
// rows of the fp64 block x.
func gemmTiles[Y float](dst []Y, x []float64, n int, w *kernels.Matrix, lo, hi int, s *gemmScratch) {
	I, O := w.Cols, w.Rows
	if len(s.row) < I {
		s.row, s.w = make([]float32, I), make([]float64, tileO*I)
	}
	for tile := lo; tile < hi; tile++ {
		o0 := tile * tileO
		nw := min(tileO, O-o0)
		for j := 0; j < nw; j++ {
			decodeRow(s.row[:I], w, o0+j)
			toF64(s.w[j*I:(j+1)*I], s.row[:I])
		}
		if nw == tileO {
			gemmTile4(dst, x, n, s.w[:tileO*I], o0, I, O)
			continue
		}
		for j := 0; j < nw; j++ {
			wr := s.w[j*I : (j+1)*I]
			for t := 0; t < n; t++ {
				dst[t*O+o0+j] = Y(dotSeq(x[t*I:(t+1)*I], wr))
			}
		}
	}
}

// gemmTile4 computes the four output columns o0..o0+3 of n rows from four
// decoded weight rows, four x rows at a time (a 4x4 register tile: 8 loads
// per 16 multiply-adds). Each output is one sequential fp64 sum.
func gemmTile4[Y float](dst []Y, x []float64, n int, w []float64, o0, I, O int) {
	w0, w1, w2, w3 := w[0:I], w[I:2*I], w[2*I:3*I], w[3*I:4*I]
	t := 0
	for ; t+4 <= n; t += 4 {
		x0 := x[t*I : t*I+I]
		x1 := x[(t+1)*I : (t+1)*I+I]
		x2 := x[(t+2)*I : (t+2)*I+I]
		x3 := x[(t+3)*I : (t+3)*I+I]
		var a00, a01, a02, a03, a10, a11, a12, a13 float64
		var a20, a21, a22, a23, a30, a31, a32, a33 float64
		for k := range x0 {
			v0, v1, v2, v3 := w0[k], w1[k], w2[k], w3[k]
			u := x0[k]
			a00 = math.FMA(u, v0, a00)
			a01 = math.FMA(u, v1, a01)
			a02 = math.FMA(u, v2, a02)
			a03 = math.FMA(u, v3, a03)
			u = x1[k]
			a10 = math.FMA(u, v0, a10)
			a11 = math.FMA(u, v1, a11)
			a12 = math.FMA(u, v2, a12)
			a13 = math.FMA(u, v3, a13)
			u = x2[k]
			a20 = math.FMA(u, v0, a20)
			a21 = math.FMA(u, v1, a21)
			a22 = math.FMA(u, v2, a22)
			a23 = math.FMA(u, v3, a23)
			u = x3[k]
			a30 = math.FMA(u, v0, a30)
			a31 = math.FMA(u, v1, a31)
			a32 = math.FMA(u, v2, a32)
			a33 = math.FMA(u, v3, a33)
		}
		r := dst[t*O+o0 : t*O+o0+4]
		r[0], r[1], r[2], r[3] = Y(a00), Y(a01), Y(a02), Y(a03)
		r = dst[(t+1)*O+o0 : (t+1)*O+o0+4]
		r[0], r[1], r[2], r[3] = Y(a10), Y(a11), Y(a12), Y(a13)
		r = dst[(t+2)*O+o0 : (t+2)*O+o0+4]
		r[0], r[1], r[2], r[3] = Y(a20), Y(a21), Y(a22), Y(a23)
		r = dst[(t+3)*O+o0 : (t+3)*O+o0+4]
		r[0], r[1], r[2], r[3] = Y(a30), Y(a31), Y(a32), Y(a33)
	}
	for ; t < n; t++ {
		xr := x[t*I : t*I+I]
		var a0, a1, a2, a3 float64
		for k, u := range xr {
			a0 = math.FMA(u, w0[k], a0)
			a1 = math.FMA(u, w1[k], a1)
			a2 = math.FMA(u, w2[k], a2)
			a3 = math.FMA(u, w3[k], a3)
		}
		r := dst[t*O+o0 : t*O+o0+4]
		r[0], r[1], r[2], r[3] = Y(a0), Y(a1), Y(a2), Y(a3)
	}
}

// dotSeq is the canonical dot product: one fp64 accumulator, sequential in k.
func dotSeq(a, b []float64) float64 {
	b = b[:len(a)]
	var s float64
	for i, v := range a {
		s = math.FMA(v, b[i], s)
	}
	return s
}
