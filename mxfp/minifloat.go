package mxfp

import "math"

// minifloat describes a sign-magnitude float of at most 8 bits with
// subnormals: E2M1, E4M3 and E5M2 differ only in these numbers.
type minifloat struct {
	mbits   int   // mantissa bits
	bias    int   // exponent bias
	emax    int   // exponent of the largest normal (OCP "emax_elem")
	maxMag  uint8 // code of the largest finite magnitude
	signBit uint8
}

var (
	fmtE2M1 = minifloat{mbits: 1, bias: 1, emax: 2, maxMag: 0x07, signBit: 0x08}   // max 6
	fmtE4M3 = minifloat{mbits: 3, bias: 7, emax: 8, maxMag: 0x7E, signBit: 0x80}   // max 448
	fmtE5M2 = minifloat{mbits: 2, bias: 15, emax: 15, maxMag: 0x7B, signBit: 0x80} // max 57344
)

// magnitude returns the value of a finite magnitude code (sign bit clear).
func (f minifloat) magnitude(code uint8) float64 {
	e := int(code) >> f.mbits
	m := int(code) & (1<<f.mbits - 1)
	if e == 0 {
		return math.Ldexp(float64(m), 1-f.bias-f.mbits)
	}
	return math.Ldexp(float64(1<<f.mbits+m), e-f.bias-f.mbits)
}

// encode rounds a finite v to the nearest representable value, ties to the
// even code, and saturates beyond the largest finite magnitude (the OCP MX
// conversion rule). The sign of zero is kept.
func (f minifloat) encode(v float64) uint8 {
	var sign uint8
	if math.Signbit(v) {
		sign, v = f.signBit, -v
	}
	if v >= f.magnitude(f.maxMag) {
		return sign | f.maxMag
	}
	if v == 0 {
		return sign
	}
	_, e := math.Frexp(v) // v = frac x 2^e with frac in [0.5, 1)
	exp := max(e-1, 1-f.bias)
	// n quanta of 2^(exp-mbits); a round-up to 2^(mbits+1) carries into the
	// exponent field by itself, and subnormals fall out at exp = 1-bias.
	n := int(math.RoundToEven(math.Ldexp(v, f.mbits-exp)))
	return sign | uint8((exp+f.bias-1)<<f.mbits+n)
}
