package machine

import "golang.org/x/sys/cpu"

// The AVX2+FMA loops of simd_amd64.s. The CPU backend's GEMM runs its
// assembly under the same condition (and GODEBUG=cpu.avx2=off turns both
// off), so the limit reported is the one its kernels work against.

//go:noescape
func fmaLoopAVX2(n int) float64

//go:noescape
func sumAVX2(p *uint64, n int) uint64

const (
	simdFMAName = "AVX2 4-wide fp64 FMA"
	// 12 independent accumulators of 4 lanes.
	simdChains = 12
	simdLanes  = 4
)

func hasSIMDFMA() bool { return cpu.X86.HasAVX2 && cpu.X86.HasFMA }

func simdFMALoop(n int) float64 { return fmaLoopAVX2(n) }

func sumWords(part []uint64) uint64 {
	if !cpu.X86.HasAVX2 || len(part) < 16 {
		return sumGo(part)
	}
	n := len(part) &^ 15
	return sumAVX2(&part[0], n) + sumGo(part[n:])
}
