package cpu

import "math"

// The GEMM works on packed operands so that the inner loop can vectorise
// across output columns while every output stays one sequential FMA chain
// over k (see MatMul):
//
//   - a weight panel holds groupW consecutive output columns (weight rows)
//     for a chunk of at most panelK values of k, k-major, in fp32 (which
//     holds every storage format's values exactly; kernels widen to fp64):
//     wp[kk*groupW+j] = W[o0+j][k0+kk];
//   - an activation tile holds mr rows of x for every k, k-major and in fp64:
//     xp[k*mr+i] = x[t0+i][k];
//   - accumulators live in fp64 rows of groupW values, c[i*groupW+j], and
//     are loaded and stored between k chunks (exactly: fp64 in, fp64 out).
//
// A tile kernel then runs acc[i][j] = fma(x[i][k], w[k][j], acc[i][j]) for
// k in order, with a broadcast x and a vector of adjacent columns: each
// vector lane is one output's chain, so the bits equal math.FMA's.
const (
	groupW = 32  // output columns per weight panel (and per accumulator row)
	panelK = 128 // k values per packed weight panel; a multiple of MXBlock
	packW  = 8   // weight rows transposed by one pack call

	gemvRows = 16  // weight rows of one gemv kernel call
	gemvK    = 256 // k values decoded at a time for the one-row kernels
)

// tileRows is the tile height used for the next rows of a block with r rows
// left: 6 while it fits, then 4, 2, 1; 5 and 3 round up with a zero row.
func tileRows(r int) int {
	switch {
	case r >= 5:
		return 6
	case r >= 3:
		return 4
	}
	return r
}

// runTile accumulates one k chunk of a tile of mr rows into its 32
// accumulator columns; cols is how many of them are real (wider panels of
// a partial group are skipped).
func (kn *kernelSet) runTile(mr, cols int, c, x []float64, w []float32, k int) {
	switch mr {
	case 6, 4:
		f := kn.tile6x8
		if mr == 4 {
			f = kn.tile4x8
		}
		for c0 := 0; c0 < cols; c0 += 8 {
			f(&c[c0], &x[0], &w[c0], k)
		}
	case 2:
		for c0 := 0; c0 < cols; c0 += 16 {
			kn.tile2x16(&c[c0], &x[0], &w[c0], k)
		}
	case 1:
		kn.tile1x32(&c[0], &x[0], &w[0], k)
	default:
		panic("cpu: bad tile height")
	}
}

// tileGo is the portable micro-kernel: mr rows by nc columns, four
// columns of two rows at a time in registers.
func tileGo(mr, nc int, cp, xp *float64, wp *float32, k int) {
	c := unsafeSlice(cp, (mr-1)*groupW+nc)
	x := unsafeSlice(xp, k*mr)
	w := unsafeSlice(wp, (k-1)*groupW+nc)
	for i := 0; i+2 <= mr; i += 2 {
		for j := 0; j < nc; j += 4 {
			r0, r1 := c[i*groupW+j:][:4], c[(i+1)*groupW+j:][:4]
			a0, a1, a2, a3 := r0[0], r0[1], r0[2], r0[3]
			b0, b1, b2, b3 := r1[0], r1[1], r1[2], r1[3]
			for kk := 0; kk < k; kk++ {
				wv := w[kk*groupW+j:][:4]
				w0, w1, w2, w3 := float64(wv[0]), float64(wv[1]), float64(wv[2]), float64(wv[3])
				u, v := x[kk*mr+i], x[kk*mr+i+1]
				a0 = math.FMA(u, w0, a0)
				a1 = math.FMA(u, w1, a1)
				a2 = math.FMA(u, w2, a2)
				a3 = math.FMA(u, w3, a3)
				b0 = math.FMA(v, w0, b0)
				b1 = math.FMA(v, w1, b1)
				b2 = math.FMA(v, w2, b2)
				b3 = math.FMA(v, w3, b3)
			}
			r0[0], r0[1], r0[2], r0[3] = a0, a1, a2, a3
			r1[0], r1[1], r1[2], r1[3] = b0, b1, b2, b3
		}
	}
	if mr%2 == 0 {
		return
	}
	i := mr - 1
	for j := 0; j < nc; j += 8 {
		r := c[i*groupW+j:][:8]
		a0, a1, a2, a3, a4, a5, a6, a7 := r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]
		for kk := 0; kk < k; kk++ {
			wv := w[kk*groupW+j:][:8]
			u := x[kk*mr+i]
			a0 = math.FMA(u, float64(wv[0]), a0)
			a1 = math.FMA(u, float64(wv[1]), a1)
			a2 = math.FMA(u, float64(wv[2]), a2)
			a3 = math.FMA(u, float64(wv[3]), a3)
			a4 = math.FMA(u, float64(wv[4]), a4)
			a5 = math.FMA(u, float64(wv[5]), a5)
			a6 = math.FMA(u, float64(wv[6]), a6)
			a7 = math.FMA(u, float64(wv[7]), a7)
		}
		r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7] = a0, a1, a2, a3, a4, a5, a6, a7
	}
}

func packF32Go(dstp *float32, srcp *float32, lds, k int) {
	dst := unsafeSlice(dstp, (k-1)*groupW+packW)
	src := unsafeSlice(srcp, (packW-1)*lds+k)
	for j := 0; j < packW; j++ {
		row := src[j*lds:][:k]
		for kk, v := range row {
			dst[kk*groupW+j] = v
		}
	}
}

func packBF16Go(dstp *float32, srcp *uint16, lds, k int) {
	dst := unsafeSlice(dstp, (k-1)*groupW+packW)
	src := unsafeSlice(srcp, (packW-1)*lds+k)
	for j := 0; j < packW; j++ {
		row := src[j*lds:][:k]
		for kk, v := range row {
			dst[kk*groupW+j] = bf16(v)
		}
	}
}

// gemv16F32Go and gemv16BF16Go are the portable one-row kernels: one chain
// per weight row, four rows interleaved so that the chains overlap.
func gemv16F32Go(acc *[16]float64, xbp *float64, wp *float32, lds, k int) {
	xb := unsafeSlice(xbp, 4*k)
	w := unsafeSlice(wp, 15*lds+k)
	for r := 0; r < 16; r += 4 {
		w0, w1, w2, w3 := w[r*lds:][:k], w[(r+1)*lds:][:k], w[(r+2)*lds:][:k], w[(r+3)*lds:][:k]
		a0, a1, a2, a3 := acc[r], acc[r+1], acc[r+2], acc[r+3]
		for kk := range w0 {
			u := xb[4*kk]
			a0 = math.FMA(u, float64(w0[kk]), a0)
			a1 = math.FMA(u, float64(w1[kk]), a1)
			a2 = math.FMA(u, float64(w2[kk]), a2)
			a3 = math.FMA(u, float64(w3[kk]), a3)
		}
		acc[r], acc[r+1], acc[r+2], acc[r+3] = a0, a1, a2, a3
	}
}

func gemv16BF16Go(acc *[16]float64, xbp *float64, wp *uint16, lds, k int) {
	xb := unsafeSlice(xbp, 4*k)
	w := unsafeSlice(wp, 15*lds+k)
	for r := 0; r < 16; r += 4 {
		w0, w1, w2, w3 := w[r*lds:][:k], w[(r+1)*lds:][:k], w[(r+2)*lds:][:k], w[(r+3)*lds:][:k]
		a0, a1, a2, a3 := acc[r], acc[r+1], acc[r+2], acc[r+3]
		for kk := range w0 {
			u := xb[4*kk]
			a0 = math.FMA(u, float64(bf16(w0[kk])), a0)
			a1 = math.FMA(u, float64(bf16(w1[kk])), a1)
			a2 = math.FMA(u, float64(bf16(w2[kk])), a2)
			a3 = math.FMA(u, float64(bf16(w3[kk])), a3)
		}
		acc[r], acc[r+1], acc[r+2], acc[r+3] = a0, a1, a2, a3
	}
}
