package cpu

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/machine"
	"github.com/tandem-inference/tandem/kernels"
)

// Benchmarks report their rate next to this machine's limit measured in the
// same process (internal/machine): GFLOP/s against the fp64 FMA peak of the
// kernels' instruction set (%peak), weight GB/s against the memory read
// bandwidth (%mem). Run with, e.g.,
//
//	go test -run '^$' -bench . -benchtime 20x -count 5 ./kernels/cpu/
//
// and compare ratios, not absolute times. The limits are measured again
// after every sub-benchmark and the highest seen is kept: on a machine
// shared with other work a probe that lost its core would understate them.

var limits struct {
	sync.Mutex
	flops, mem map[int]float64
}

// limitFor measures the limits for threads now and returns the highest
// seen in this process (mem only when withMem: that probe reads 256 MiB).
func limitFor(threads int, withMem bool) (gflops, gbps float64) {
	f := machine.FMAGFLOPS(threads)
	m := 0.0
	if withMem {
		m = machine.MemReadGBPS(threads)
	}
	limits.Lock()
	defer limits.Unlock()
	if limits.flops == nil {
		limits.flops, limits.mem = map[int]float64{}, map[int]float64{}
	}
	limits.flops[threads] = max(limits.flops[threads], f)
	limits.mem[threads] = max(limits.mem[threads], m)
	return limits.flops[threads], limits.mem[threads]
}

// BenchmarkMatMulPrefill: a 64-row GEMM on the shapes of the small model's
// dense FFN, compute bound.
func BenchmarkMatMulPrefill(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	shapes := []struct{ O, I int }{{2048, 768}, {768, 2048}}
	for _, f := range []kernels.Format{kernels.BF16, kernels.MXFP4, kernels.F32} {
		for _, sh := range shapes {
			w := randMatrix(rng, f, sh.O, sh.I, 120, 130)
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/%dx%d/T64/threads%d", f, sh.O, sh.I, threads), func(b *testing.B) {
					be := New(threads)
					x := &kernels.Tensor{Rows: 64, Cols: sh.I, Data: randX[float32](rng, 64*sh.I)}
					dst := be.NewTensor(64, sh.O)
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						be.MatMul(dst, x, w)
					}
					g := 2 * 64 * float64(sh.O) * float64(sh.I) * float64(b.N) / b.Elapsed().Seconds() / 1e9
					peak, _ := limitFor(threads, false)
					b.ReportMetric(g, "GFLOP/s")
					b.ReportMetric(100*g/peak, "%peak")
				})
			}
		}
	}
}

// BenchmarkMatMulDecode: one row through a set of BF16 (or MXFP4) matrices
// larger than the last-level cache, as a decode step reads its weights.
func BenchmarkMatMulDecode(b *testing.B) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, f := range []kernels.Format{kernels.BF16, kernels.MXFP4} {
		// 96 MiB of BF16 (3 MiB each) or 96 MiB of MXFP4 (0.8 MiB each).
		const O, I = 2048, 768
		n := 32
		if f == kernels.MXFP4 {
			n = 120
		}
		ws := make([]*kernels.Matrix, n)
		var bytes int
		for i := range ws {
			ws[i] = randMatrix(rng, f, O, I, 120, 130)
			bytes += ws[i].Bytes()
		}
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/%dx%d/T1/threads%d", f, O, I, threads), func(b *testing.B) {
				be := New(threads)
				x := &kernels.Tensor{Rows: 1, Cols: I, Data: randX[float32](rng, I)}
				dst := be.NewTensor(1, O)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					for _, w := range ws {
						be.MatMul(dst, x, w)
					}
				}
				g := float64(bytes) * float64(b.N) / b.Elapsed().Seconds() / 1e9
				_, mem := limitFor(threads, true)
				b.ReportMetric(g, "GB/s")
				b.ReportMetric(100*g/mem, "%mem")
			})
		}
	}
}

// BenchmarkRoutedExperts: the small model's LatentMoE expert step (512
// MXFP4 experts [256, 384] / [384, 256], top 8) for a 64-token prefill and
// a one-token decode step.
func BenchmarkRoutedExperts(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	const E, lat, inter, k = 512, 384, 256, 8
	experts := make([]kernels.Expert, E)
	var expertBytes int
	for e := range experts {
		experts[e] = kernels.Expert{
			W1: randMatrix(rng, kernels.MXFP4, inter, lat, 120, 130),
			W3: randMatrix(rng, kernels.MXFP4, inter, lat, 120, 130),
			W2: randMatrix(rng, kernels.MXFP4, lat, inter, 120, 130),
		}
		expertBytes = experts[e].W1.Bytes() + experts[e].W3.Bytes() + experts[e].W2.Bytes()
	}
	for _, T := range []int{64, 1} {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("T%d/threads%d", T, threads), func(b *testing.B) {
				be := New(threads)
				z := &kernels.Tensor{Rows: T, Cols: lat, Data: randX[float32](rng, T*lat)}
				u := be.NewTensor(T, lat)
				ids := make([]int32, T*k)
				wts := make([]float32, T*k)
				used := map[int32]bool{}
				for i := range ids {
					ids[i] = int32(rng.IntN(E))
					for j := i - i%k; j < i; j++ {
						if ids[j] == ids[i] { // distinct experts per row
							ids[i] = (ids[i] + 1) % E
							j = i - i%k - 1
						}
					}
					used[ids[i]] = true
					wts[i] = rng.Float32() / k
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					be.RoutedExperts(u, z, ids, wts, k, experts, 4, 25)
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				peak, mem := limitFor(threads, true)
				g := 2 * 3 * float64(T*k) * inter * lat / sec / 1e9
				gb := float64(len(used)*expertBytes) / sec / 1e9
				b.ReportMetric(g, "GFLOP/s")
				b.ReportMetric(100*g/peak, "%peak")
				b.ReportMetric(gb, "GB/s")
				b.ReportMetric(100*gb/mem, "%mem")
			})
		}
	}
}

// BenchmarkMatMulFewRows: 1 to 5 rows through the same weights (a decode
// step and a verify step of drafted rows), each row count's time over one
// row's in the same run.
func BenchmarkMatMulFewRows(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, f := range []kernels.Format{kernels.BF16, kernels.MXFP4} {
		const O, I = 2048, 768
		ws := make([]*kernels.Matrix, 32)
		for i := range ws {
			ws[i] = randMatrix(rng, f, O, I, 120, 130)
		}
		b.Run(f.String(), func(b *testing.B) {
			be := New(1)
			var took [6]time.Duration
			for i := 0; i < b.N; i++ {
				for rows := 1; rows <= 5; rows++ {
					x := &kernels.Tensor{Rows: rows, Cols: I, Data: randX[float32](rng, rows*I)}
					dst := be.NewTensor(rows, O)
					t0 := time.Now()
					for _, w := range ws {
						be.MatMul(dst, x, w)
					}
					took[rows] += time.Since(t0)
				}
			}
			for rows := 2; rows <= 5; rows++ {
				b.ReportMetric(float64(took[rows])/float64(took[1]), fmt.Sprintf("rows%d/rows1", rows))
			}
		})
	}
}
