//go:build !amd64 && !arm64

package machine

// No vector FMA loop is written for this architecture: FMAKind says so
// and FMAGFLOPS reports the scalar rate.

const (
	simdFMAName = ""
	simdChains  = 0
	simdLanes   = 0
)

func hasSIMDFMA() bool { return false }

func simdFMALoop(int) float64 { return 0 }

func sumWords(part []uint64) uint64 { return sumGo(part) }
