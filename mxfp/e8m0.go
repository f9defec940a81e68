package mxfp

import "math"

// BlockSize is the number of elements that share one E8M0 scale.
const BlockSize = 32

// ScaleNaN is the E8M0 code the OCP MX specification reserves for NaN.
const ScaleNaN = 255

// e8m0 holds every E8M0 code's multiplier; the kernels index it instead of
// calling E8M0 so that the inner loops stay branch-free.
var e8m0 = func() (t [256]float32) {
	for s := range t {
		t[s] = e8m0Value(uint8(s))
	}
	return t
}()

// E8M0 returns the multiplier 2^(s-127) of a scale byte. s = 255 is NaN (OCP
// MX); s = 0 is 2^-127, a float32 subnormal.
func E8M0(s uint8) float32 { return e8m0[s] }

func e8m0Value(s uint8) float32 {
	switch s {
	case ScaleNaN:
		return float32(math.NaN())
	case 0:
		return math.Float32frombits(1 << 22) // 2^-127 has no normal float32 encoding
	}
	return math.Float32frombits(uint32(s) << 23)
}
