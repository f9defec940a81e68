package vision

import (
	"math"

	"github.com/tandem-inference/tandem/internal/expmath"
)

// Elementary functions with the same bits on amd64 and arm64. Go fuses a*b+c
// into one instruction on arm64 and never on amd64, and math's sine, cosine,
// erf and pow are Go code it compiles either way (or assembly on one of
// them), so the tower would compute different features on the two. These
// round every product explicitly and take exp from internal/expmath; their
// results are rounded to fp32 by their callers, and they are accurate far
// beyond that (TestPortableFunctions).

// piOver2Hi has the first 33 bits of π/2, so k·piOver2Hi is exact for
// |k| < 2^20; piOver2Lo is the rest.
const (
	piOver2Hi = 1.57079632673412561417e+00
	piOver2Lo = 6.07710050650619224932e-11
)

// sinCos returns sin a and cos a for |a| < 2^20·π/2 (the rotary angles are
// at most 512 radians).
func sinCos(a float64) (sin, cos float64) {
	k := math.Round(float64(a * (2 / math.Pi)))
	r := float64(a-float64(k*piOver2Hi)) - float64(k*piOver2Lo) // |r| <= π/4 (to rounding)
	r2 := float64(r * r)
	// Taylor series to r^15 and r^16: the next terms are below 2e-17 at π/4.
	s, c := -1.0/1307674368000, 1.0/20922789888000
	for _, t := range [...][2]float64{
		{1.0 / 6227020800, -1.0 / 87178291200},
		{-1.0 / 39916800, 1.0 / 479001600},
		{1.0 / 362880, -1.0 / 3628800},
		{-1.0 / 5040, 1.0 / 40320},
		{1.0 / 120, -1.0 / 720},
		{-1.0 / 6, 1.0 / 24},
		{1, -0.5},
	} {
		s = float64(s*r2) + t[0]
		c = float64(c*r2) + t[1]
	}
	s = float64(s * r)
	c = float64(c*r2) + 1
	switch int64(k) & 3 {
	case 0:
		return s, c
	case 1:
		return c, -s
	case 2:
		return -s, -c
	}
	return -c, s
}

// erf is the error function, from the everywhere-positive series
// erf z = 2/√π · e^(−z²) · Σ 2^n z^(2n+1) / (1·3·…·(2n+1)), which has no
// cancellation; erf is 1 to fp64 beyond z = 6. The error is below 1e-14
// absolute, which near −∞ leaves 1 + erf (GELU's factor there) with an
// absolute error of that size too.
func erf(z float64) float64 {
	if z < 0 {
		return -erf(-z)
	}
	if z > 6 {
		return 1
	}
	z2 := float64(2 * float64(z*z))
	term, sum := z, z
	for n := 1; term > 1e-17*sum; n++ {
		term = float64(term*z2) / float64(2*n+1)
		sum += term
	}
	return float64(float64(2/math.SqrtPi)*expmath.Exp(-float64(z*z))) * sum
}

// ln10000 is log 10000, the rotary base's logarithm.
const ln10000 = 9.210340371976184

// ropeFreq is base^(−e) for the rotary frequencies, as exp(−e · ln base).
func ropeFreq(base, e float64) float64 {
	lnBase := ln10000
	if base != 10000 {
		lnBase = math.Log(base) // only configs with another base; not portable
	}
	return expmath.Exp(-float64(e * lnBase))
}
