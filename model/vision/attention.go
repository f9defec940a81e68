package vision

import (
	"math"

	"github.com/tandem-inference/tandem/kernels"
)

// Attention: the fused wqkv output of a row is read as (3, heads, hd): all
// of q, then all of k, then all of v. q and k are rotated by the 2-D rotary
// embedding of the row's patch, then every head attends with full,
// non-causal softmax(q·kᵀ/√hd)·v over the rows of its own image only: the
// images of a batch are packed one after another, as variable-length
// sequences.
//
// The two products run as the backend's MatMul (the keys and the
// transposed values of one head are an fp32 weight for the call); the
// softmax between them runs on the host, since the Backend has no op for a
// non-causal softmax.

// segment is one image's rows [lo, hi) of the packed batch and its grid.
type segment struct{ lo, hi, h, w int }

// scoreBlock bounds one query block's scores (values), so that a large
// image's T x T matrix is never held at once.
const scoreBlock = 1 << 22

// attention returns the heads' outputs [N, QKV] for qkv [N, 3*QKV]
// (host values; q and k are rotated in place).
func (t *Tower) attention(qkv []float32, segs []segment) ([]float32, error) {
	c := t.cfg
	hd, width := c.HeadDim(), 3*c.QKV
	out := make([]float32, (len(qkv)/width)*c.QKV)
	for _, s := range segs {
		rope := newRopeTable(s.h, s.w, hd, c.RopeTheta)
		parallelRows(t.be.Threads(), s.hi-s.lo, func(lo, hi int) {
			for r := lo; r < hi; r++ {
				row := qkv[(s.lo+r)*width : (s.lo+r+1)*width]
				rope.rotate(row[:c.QKV], r)        // q
				rope.rotate(row[c.QKV:2*c.QKV], r) // k
			}
		})
		for h := 0; h < c.Heads; h++ {
			if err := t.attendHead(out, qkv, s, h); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// attendHead computes head h of one image into out's columns of that head.
func (t *Tower) attendHead(out, qkv []float32, s segment, h int) error {
	c, be := t.cfg, t.be
	hd, width, T := c.HeadDim(), 3*c.QKV, s.hi-s.lo
	q := make([]float32, T*hd)
	k := make([]float32, T*hd)
	vt := make([]float32, hd*T) // vᵀ: [hd, T]
	for r := 0; r < T; r++ {
		row := qkv[(s.lo+r)*width:]
		copy(q[r*hd:(r+1)*hd], row[h*hd:])
		copy(k[r*hd:(r+1)*hd], row[c.QKV+h*hd:])
		for e, v := range row[2*c.QKV+h*hd : 2*c.QKV+(h+1)*hd] {
			vt[e*T+r] = v
		}
	}
	km := kernels.NewF32Matrix("vision attention keys", T, hd, k)
	vm := kernels.NewF32Matrix("vision attention values", hd, T, vt)
	for _, m := range []*kernels.Matrix{km, vm} {
		if err := be.Bind(m); err != nil {
			return err
		}
		defer be.Release(m)
	}
	scale := 1 / math.Sqrt(float64(hd))
	block := max(1, min(T, scoreBlock/T))
	for q0 := 0; q0 < T; q0 += block {
		n := min(block, T-q0)
		qt := upload(be, q[q0*hd:(q0+n)*hd], n, hd)
		st := be.NewTensor(n, T)
		be.MatMul(st, qt, km)
		scores := download(be, st)
		parallelRows(be.Threads(), n, func(lo, hi int) {
			scratch := make([]float64, T)
			for r := lo; r < hi; r++ {
				softmax(scores[r*T:(r+1)*T], scale, scratch)
			}
		})
		be.Upload(st, scores)
		ot := be.NewTensor(n, hd)
		be.MatMul(ot, st, vm)
		o := download(be, ot)
		for r := 0; r < n; r++ {
			copy(out[(s.lo+q0+r)*c.QKV+h*hd:], o[r*hd:(r+1)*hd])
		}
		be.Free(qt)
		be.Free(st)
		be.Free(ot)
	}
	return nil
}

// softmax replaces the row of scores by softmax(scale·scores), in fp64
// inside (e is scratch of the row's length), rounded once.
func softmax(row []float32, scale float64, e []float64) {
	m := row[0]
	for _, v := range row {
		m = max(m, v)
	}
	var sum float64
	for i, v := range row {
		e[i] = expNonPositive(float64(float64(v)-float64(m)) * scale)
		sum += e[i]
	}
	for i := range row {
		row[i] = float32(e[i] / sum)
	}
}

// expNonPositive is e^x for x <= 0 to a relative error below 1e-8, far
// finer than the fp32 it is rounded to: the softmax takes one per score,
// T² per head, where a full-precision exp would dominate the tower's time.
// x = k·ln2 + r with |r| <= ln2/2, e^r by its Taylor series to r^8/8!
// (error < 3e-9), times 2^k. Every product is rounded before the sum it
// feeds (no fused multiply-add), so amd64 and arm64 give the same bits.
func expNonPositive(x float64) float64 {
	const (
		log2e = 1.4426950408889634
		ln2Hi = 6.93147180369123816490e-01
		ln2Lo = 1.90821492927058770002e-10
	)
	if x < -708 {
		return 0
	}
	ki := -int64(float64(-x*log2e) + 0.5) // the nearest integer to x·log2(e)
	k := float64(ki)
	r := float64(x-float64(k*ln2Hi)) - float64(k*ln2Lo)
	p := float64(r*(1.0/40320)) + 1.0/5040
	p = float64(p*r) + 1.0/720
	p = float64(p*r) + 1.0/120
	p = float64(p*r) + 1.0/24
	p = float64(p*r) + 1.0/6
	p = float64(p*r) + 0.5
	p = float64(p*r) + 1
	p = float64(p*r) + 1
	return p * math.Float64frombits(uint64(ki+1023)<<52)
}
