//go:build !amd64

package machine

const (
	simdFMAName      = ""
	simdFlopsPerIter = 0
)

func hasSIMDFMA() bool { return false }

func simdFMALoop(int) float64 { return 0 }

func sumWords(part []uint64) uint64 { return sumGo(part) }
