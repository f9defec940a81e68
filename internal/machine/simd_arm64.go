package machine

// The NEON loops of simd_arm64.s. Advanced SIMD is part of every arm64 CPU
// Go runs on, so the peak is always the vector one: the CPU backend's
// portable kernels run scalar FMADDs there, and a ratio against the scalar
// rate would hide the factor a vector kernel could still gain.

//go:noescape
func fmaLoopNEON(n int) float64

//go:noescape
func sumNEON(p *uint64, n int) uint64

const (
	simdFMAName = "NEON 2-wide fp64 FMA"
	simdChains  = 24
	simdLanes   = 2
)

func hasSIMDFMA() bool { return true }

func simdFMALoop(n int) float64 { return fmaLoopNEON(n) }

func sumWords(part []uint64) uint64 {
	if len(part) < 16 {
		return sumGo(part)
	}
	n := len(part) &^ 15
	return sumNEON(&part[0], n) + sumGo(part[n:])
}
