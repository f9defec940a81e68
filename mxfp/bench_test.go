package mxfp

import (
	"math/rand/v2"
	"testing"
	"time"
)

// dotF32 is the baseline: a plain float32 dot product with the same four
// accumulators the fused kernels use.
func dotF32(w, x []float32) float32 {
	var a0, a1, a2, a3 float32
	i := 0
	for ; i+4 <= len(w) && i+4 <= len(x); i += 4 {
		a0 += w[i] * x[i]
		a1 += w[i+1] * x[i+1]
		a2 += w[i+2] * x[i+2]
		a3 += w[i+3] * x[i+3]
	}
	for ; i < len(w); i++ {
		a0 += w[i] * x[i]
	}
	return a0 + a1 + (a2 + a3)
}

type benchRow struct {
	packed, elems, scales []byte
	x, w, tmp             []float32
}

// newBenchRow is one row of K3's expert w2 input width (3584) or the
// hidden width (7168), filled like a real expert row.
func newBenchRow(n int) *benchRow {
	rng := rand.New(rand.NewPCG(uint64(n), 1))
	r := &benchRow{packed: make([]byte, n/2), elems: make([]byte, n), scales: make([]byte, n/32),
		x: make([]float32, n), w: make([]float32, n), tmp: make([]float32, n)}
	for i := range r.x {
		r.x[i] = float32(rng.NormFloat64())
		r.w[i] = float32(rng.NormFloat64() * 0.02)
	}
	QuantizeMXFP4(r.packed, r.scales, r.w)
	QuantizeMXFP8(r.elems, make([]byte, n/32), r.w, false)
	return r
}

var sink float32

func BenchmarkDot(b *testing.B) {
	for _, n := range []int{3584, 7168} {
		r := newBenchRow(n)
		name := func(s string) string { return s + "/n=" + itoa(n) }
		b.Run(name("MXFP4Fused"), func(b *testing.B) {
			b.SetBytes(int64(n/2 + n/32))
			for b.Loop() {
				sink += DotMXFP4(r.packed, r.scales, r.x)
			}
		})
		b.Run(name("MXFP4DequantThenDot"), func(b *testing.B) {
			b.SetBytes(int64(n/2 + n/32))
			for b.Loop() {
				DequantMXFP4(r.tmp, r.packed, r.scales)
				sink += dotF32(r.tmp, r.x)
			}
		})
		b.Run(name("MXFP8Fused"), func(b *testing.B) {
			b.SetBytes(int64(n + n/32))
			for b.Loop() {
				sink += DotMXFP8(r.elems, r.scales, r.x, false)
			}
		})
		b.Run(name("MXFP8DequantThenDot"), func(b *testing.B) {
			b.SetBytes(int64(n + n/32))
			for b.Loop() {
				DequantMXFP8(r.tmp, r.elems, r.scales, false)
				sink += dotF32(r.tmp, r.x)
			}
		})
		b.Run(name("F32"), func(b *testing.B) {
			b.SetBytes(int64(4 * n))
			for b.Loop() {
				sink += dotF32(r.w, r.x)
			}
		})
	}
}

// BenchmarkDotRatio times the fused kernels, decode-then-dot and a plain
// float32 dot of the same length in the same run, interleaved, and reports
// time ratios: fused/f32 is the cost of reading 4-bit weights instead of
// float32 ones, fused/dequant the gain of not materializing the row. The
// fused kernels failing to beat decode-then-dot is an error.
func BenchmarkDotRatio(b *testing.B) {
	const n, batch = 7168, 64
	r := newBenchRow(n)
	var t4, t4d, t8, t8d, tf time.Duration
	timed := func(d *time.Duration, f func()) {
		start := time.Now()
		for range batch {
			f()
		}
		*d += time.Since(start)
	}
	for b.Loop() {
		timed(&t4, func() { sink += DotMXFP4(r.packed, r.scales, r.x) })
		timed(&t4d, func() { DequantMXFP4(r.tmp, r.packed, r.scales); sink += dotF32(r.tmp, r.x) })
		timed(&t8, func() { sink += DotMXFP8(r.elems, r.scales, r.x, false) })
		timed(&t8d, func() { DequantMXFP8(r.tmp, r.elems, r.scales, false); sink += dotF32(r.tmp, r.x) })
		timed(&tf, func() { sink += dotF32(r.w, r.x) })
	}
	b.ReportMetric(float64(t4)/float64(tf), "mxfp4/f32")
	b.ReportMetric(float64(t4)/float64(t4d), "mxfp4/dequant")
	b.ReportMetric(float64(t8)/float64(tf), "mxfp8/f32")
	b.ReportMetric(float64(t8)/float64(t8d), "mxfp8/dequant")
	if t4 >= t4d || t8 >= t8d {
		b.Errorf("fused dot no faster than decode-then-dot: MXFP4 %v vs %v, MXFP8 %v vs %v", t4, t4d, t8, t8d)
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
