// Package expmath is the exponential and hyperbolic tangent every numeric
// path of tandem uses (the CPU reference's kernels, sampling), with the same
// bits on every architecture: a state prefilled on amd64 is decoded on
// arm64, and a seeded sample must draw the same tokens on both. math.Exp is
// not that: amd64 runs an assembly routine (with an FMA branch on CPUs that
// have it), arm64 another algorithm, and Go fuses the multiply-adds of
// math.Tanh's polynomial on arm64 but not on amd64.
//
// Exp is the amd64 routine's FMA branch written in Go with explicit
// math.FMA where it fuses and explicit float64() roundings where it does
// not, so on amd64 CPUs with FMA it returns math.Exp's bits (results from
// before tandem had its own exp are unchanged there); Tanh is math.Tanh's
// algorithm over Exp with its polynomial rounded step by step, as amd64
// evaluates it. TestExpAccuracy bounds the error; TestExpTanhDigest, run
// for arm64 under qemu by scripts/test.sh, checks the bits. A leaf: it
// imports nothing of tandem's.
package expmath

import "math"

const (
	expLog2e    = 1.4426950408889634073599246810018920
	expLn2Hi    = 0.69314718055966295651160180568695068359375 // ln 2 = expLn2Hi + expLn2Lo
	expLn2Lo    = 0.28235290563031577122588448175013436025525412068e-12
	expOverflow = 7.09782712893384e+02
)

// Exp returns e**x: the argument is reduced to r = x - k·ln2, scaled by
// 1/16, e**r - 1 is a degree-8 Taylor polynomial of r/16 squared back up
// four times as y(y+2), and the result is scaled by 2**k. The error is
// under 2 ulp (TestExpAccuracy). Like the amd64 routine it returns +Inf
// from x ≈ 709.437 on, where k reaches 1024, although e**x is finite up
// to 709.78; kept for the bits: the reference never needs e**x that large
// (softmax arguments are ≤ 0, tanh's are ≤ 88, and a sigmoid of -709 is 0
// in fp32 either way).
func Exp(x float64) float64 {
	b := math.Float64bits(x)
	switch {
	case b&^(1<<63) >= 0x7FF0000000000000: // ±Inf or NaN
		if x < 0 {
			return 0
		}
		return x
	case x > expOverflow:
		return math.Inf(1)
	}
	t := x * expLog2e
	var k int32
	if t < math.MinInt32 {
		k = math.MinInt32 // underflows below, whatever r is
	} else {
		k = int32(math.RoundToEven(t))
	}
	fk := float64(k)
	r := math.FMA(-expLn2Hi, fk, x)
	r = math.FMA(-expLn2Lo, fk, r)
	r *= 0.0625
	p := math.FMA(2.4801587301587301587e-5, r, 1.9841269841269841270e-4)
	p = math.FMA(p, r, 1.3888888888888888889e-3)
	p = math.FMA(p, r, 8.3333333333333333333e-3)
	p = math.FMA(p, r, 4.1666666666666666667e-2)
	p = math.FMA(p, r, 1.6666666666666666667e-1)
	p = math.FMA(p, r, 0.5)
	p = math.FMA(p, r, 1)
	// y = e**(r/16) - 1; each squaring is (y+2)·y, rounded after the add
	// and after the multiply, the last one fused with the final +1.
	y := float64(r * p)
	y = float64(y * (y + 2))
	y = float64(y * (y + 2))
	y = float64(y * (y + 2))
	y = math.FMA(y, y+2, 1)
	// y·2**k, with k+1023 ≤ 0 scaled in two steps so that a subnormal
	// result is rounded once.
	be := k + 0x3FF
	switch {
	case be <= 0:
		if be < -52 {
			return 0
		}
		y *= math.Float64frombits(uint64(be+0x3FE) << 52)
		be = 1
	case be >= 0x7FF:
		return math.Inf(1)
	}
	return y * math.Float64frombits(uint64(be)<<52)
}

var (
	tanhP = [...]float64{-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3}
	tanhQ = [...]float64{1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3}
)

// Tanh is math.Tanh over Exp: a rational approximation below 0.625, the
// identity 1 - 2/(e**2|x| + 1) above it; every product is rounded before
// the sum it feeds.
func Tanh(x float64) float64 {
	const maxLog = 8.8029691931113054295988e+01 // log(2**127)
	z := math.Abs(x)
	switch {
	case z > 0.5*maxLog:
		if x < 0 {
			return -1
		}
		return 1
	case z >= 0.625:
		s := Exp(2 * z)
		z = 1 - 2/(s+1)
		if x < 0 {
			z = -z
		}
		return z
	case x == 0:
		return x
	}
	s := float64(x * x)
	p := float64(tanhP[0]*s) + tanhP[1]
	p = float64(p*s) + tanhP[2]
	q := s + tanhQ[0]
	q = float64(q*s) + tanhQ[1]
	q = float64(q*s) + tanhQ[2]
	return x + x*s*p/q
}

// Probes returns inputs that span Exp's and Tanh's branches: zeros, the
// polynomial and 0.625 boundary of Tanh, Exp's subnormal, underflow and
// overflow ranges, infinities and NaN. Vector implementations check
// themselves against Exp and Tanh on them.
func Probes() []float64 {
	return []float64{
		0, math.Copysign(0, -1), 1e-300, -1e-20, 0.1, -0.3, 0.6249999999999999, 0.625, -0.625, 0.7, 1, -1, 2.5, -7.25,
		10, -20, 44, -44.01, 44.02, 88, -300, 700, 709.7, 709.79, 710, -708.5, -720, -744.4, -745.2, -800, -1e10,
		math.Inf(1), math.Inf(-1), math.NaN(), 1.0 / 3, -2.0 / 3, 0.693147, 3.14159, -1234.5, 1e5,
	}
}
