// Package machine measures this machine's limits in the same run as a
// benchmark, so that figures can be reported as ratios against them.
package machine

import (
	"math"
	"sync"
	"time"
)

// FMAGFLOPS is the fp64 fused multiply-add rate (2 FLOP each) that scalar
// Go code reaches with register-resident operands on threads goroutines:
// the ceiling of the portable GEMM inner loop (the same instruction mix,
// without memory traffic). Hardware SIMD peaks are higher.
func FMAGFLOPS(threads int) float64 {
	const iters = 1 << 24
	best := 0.0
	for rep := 0; rep < 3; rep++ {
		var wg sync.WaitGroup
		start := time.Now()
		for t := 0; t < threads; t++ {
			wg.Add(1)
			go func(seed float64) {
				defer wg.Done()
				sink = fmaKernel(seed, iters)
			}(float64(t))
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		// 16 independent accumulators, one multiply-add each per iteration.
		g := float64(threads) * iters * 16 * 2 / el / 1e9
		best = max(best, g)
	}
	return best
}

var sink float64

// fmaKernel runs 16 independent multiply-add chains (like the 4x4 GEMM tile).
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
func MemReadGBPS(threads int) float64 {
	const size = 256 << 20
	buf := make([]uint64, size/8)
	for i := range buf {
		buf[i] = uint64(i)
	}
	best := 0.0
	for rep := 0; rep < 3; rep++ {
		var wg sync.WaitGroup
		per := len(buf) / threads
		sums := make([]uint64, threads)
		start := time.Now()
		for t := 0; t < threads; t++ {
			wg.Add(1)
			go func(t int) {
				defer wg.Done()
				var s0, s1, s2, s3 uint64
				part := buf[t*per : (t+1)*per]
				for i := 0; i+4 <= len(part); i += 4 {
					s0 += part[i]
					s1 += part[i+1]
					s2 += part[i+2]
					s3 += part[i+3]
				}
				sums[t] = s0 + s1 + s2 + s3
			}(t)
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		best = max(best, float64(per*threads*8)/el/1e9)
	}
	return best
}
