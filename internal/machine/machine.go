// Package machine measures this machine's limits in the same run as a
// benchmark, so that figures can be reported as ratios against them.
package machine

import (
	"math"
	"sync"
	"time"
)

// FMAGFLOPS is the fp64 fused multiply-add rate (2 FLOP each) this machine
// reaches on threads goroutines with register-resident operands: the
// ceiling of the GEMM tile kernels. On amd64 with AVX2 and FMA (where the
// CPU backend runs its assembly, see FMAKind) it is the peak of independent
// 4-wide vector FMAs, on arm64 that of 2-wide NEON FMLAs; elsewhere no
// vector loop is measured and it is the rate of scalar Go math.FMA chains,
// which FMAKind says plainly.
func FMAGFLOPS(threads int) float64 {
	if hasSIMDFMA() {
		return rate(threads, 1<<22, simdChains*simdLanes*2, simdFMALoop)
	}
	return rate(threads, 1<<22, 16*2, func(n int) float64 { return fmaKernel(1, n) })
}

// FMAKind says which loop FMAGFLOPS times.
func FMAKind() string {
	if hasSIMDFMA() {
		return simdFMAName
	}
	return "scalar Go math.FMA (no vector FMA peak measured on this CPU)"
}

// rate runs loop(iters) on threads goroutines and returns the best of
// three GFLOP/s figures.
func rate(threads, iters int, flopsPerIter float64, loop func(n int) float64) float64 {
	best := 0.0
	for rep := 0; rep < 3; rep++ {
		var wg sync.WaitGroup
		start := time.Now()
		for t := 0; t < threads; t++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sink.Store(math.Float64bits(loop(iters)))
			}()
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		best = max(best, float64(threads)*float64(iters)*flopsPerIter/el/1e9)
	}
	return best
}

var sink atomicUint64

// fmaKernel runs 16 independent multiply-add chains (like a 4x4 GEMM tile).
func fmaKernel(seed float64, n int) float64 {
	x0, x1, x2, x3 := seed+1.0, seed+1.1, seed+1.2, seed+1.3
	v0, v1, v2, v3 := 0.999999, 0.999998, 0.999997, 0.999996
	var a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 float64
	for i := 0; i < n; i++ {
		a0 = math.FMA(x0, v0, a0)
		a1 = math.FMA(x0, v1, a1)
		a2 = math.FMA(x0, v2, a2)
		a3 = math.FMA(x0, v3, a3)
		a4 = math.FMA(x1, v0, a4)
		a5 = math.FMA(x1, v1, a5)
		a6 = math.FMA(x1, v2, a6)
		a7 = math.FMA(x1, v3, a7)
		a8 = math.FMA(x2, v0, a8)
		a9 = math.FMA(x2, v1, a9)
		a10 = math.FMA(x2, v2, a10)
		a11 = math.FMA(x2, v3, a11)
		a12 = math.FMA(x3, v0, a12)
		a13 = math.FMA(x3, v1, a13)
		a14 = math.FMA(x3, v2, a14)
		a15 = math.FMA(x3, v3, a15)
	}
	return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15
}

// MemReadGBPS is the sequential read bandwidth from RAM with threads
// goroutines, over a buffer much larger than the caches (best of three).
// The read loop is vector code where available (SIMD loads into
// independent accumulators) so that it measures the memory, not the
// loop: a scalar loop tops out below one core's share of the bandwidth.
func MemReadGBPS(threads int) float64 {
	const size = 256 << 20
	buf := make([]uint64, size/8)
	for i := range buf {
		buf[i] = uint64(i)
	}
	per := len(buf) / threads &^ 15
	best := 0.0
	for rep := 0; rep < 3; rep++ {
		var wg sync.WaitGroup
		start := time.Now()
		for t := 0; t < threads; t++ {
			wg.Add(1)
			go func(part []uint64) {
				defer wg.Done()
				sink.Store(sumWords(part))
			}(buf[t*per : (t+1)*per])
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		best = max(best, float64(per*threads*8)/el/1e9)
	}
	return best
}

// sumGo is the portable read loop: four independent sums.
func sumGo(part []uint64) uint64 {
	var s0, s1, s2, s3 uint64
	i := 0
	for ; i+4 <= len(part); i += 4 {
		s0 += part[i]
		s1 += part[i+1]
		s2 += part[i+2]
		s3 += part[i+3]
	}
	for ; i < len(part); i++ {
		s0 += part[i]
	}
	return s0 + s1 + s2 + s3
}
