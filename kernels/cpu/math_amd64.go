package cpu

import (
	"golang.org/x/sys/cpu"

	"github.com/tandem-inference/tandem/internal/expmath"
)

// Vector exp, tanh and SiTU of math_amd64.s.

//go:noescape
func expAVX2(dst, src *float64, n int)

//go:noescape
func tanhAVX2(dst, src *float64, n int)

//go:noescape
func sigmoidAVX2(dst, src *float32, n int)

//go:noescape
func gateAVX2(x *float32, n int, negA float64, lower float32)

//go:noescape
func situAVX2(gs, us *float64, n int, beta1, beta2 float64)

// vecMathOK reports whether the four-lane exp and tanh reproduce exp and
// tanh (internal/expmath), the reference's definitions, on the probes: they run
// the same steps (math's amd64 FMA algorithm), so a disagreement is a bug
// and SiTU, sigmoid and the gate fall back to the scalar functions.
var (
	vecMathCPU = cpu.X86.HasAVX && cpu.X86.HasAVX2 && cpu.X86.HasFMA
	vecMathOK  = vecMathCPU && vecMathAgrees()
)

func vecMathAgrees() bool {
	probes := expmath.Probes()
	n := (len(probes) + 3) &^ 3
	src := make([]float64, n)
	copy(src, probes)
	e, th := make([]float64, n), make([]float64, n)
	expAVX2(&e[0], &src[0], n)
	tanhAVX2(&th[0], &src[0], n)
	for i, x := range src {
		if !sameFloat(e[i], expmath.Exp(x)) || !sameFloat(th[i], expmath.Tanh(x)) {
			return false
		}
	}
	return true
}

// situVec is situInPlace on the vector path, the scalar situ for the tail.
func situVec(g, u []float64, beta1, beta2 float64) {
	u = u[:len(g)]
	n := len(g) &^ 3
	if n > 0 {
		situAVX2(&g[0], &u[0], n, beta1, beta2)
	}
	for i := n; i < len(g); i++ {
		g[i] = situ(g[i], u[i], beta1, beta2)
	}
}

// sigmoidVec is sigmoidGo on the vector path.
func sigmoidVec(dst, src []float32) {
	dst = dst[:len(src)]
	n := len(src) &^ 3
	if n > 0 {
		sigmoidAVX2(&dst[0], &src[0], n)
	}
	sigmoidGo(dst[n:], src[n:])
}

// gateVec is gateGo on the vector path.
func gateVec(x []float32, negA float64, lower float32) {
	n := len(x) &^ 3
	if n > 0 {
		gateAVX2(&x[0], n, negA, lower)
	}
	gateGo(x[n:], negA, lower)
}
