package mxfp

import "math"

var (
	e4m3Table = fp8Table(fmtE4M3, func(mag uint8) bool { return mag == 0x7F }, false)
	e5m2Table = fp8Table(fmtE5M2, func(mag uint8) bool { return mag > 0x7C }, true)
)

// fp8Table decodes all 256 codes of an 8-bit float. Magnitudes above maxMag
// are NaN when isNaN says so and infinity otherwise.
func fp8Table(f minifloat, isNaN func(mag uint8) bool, hasInf bool) (t [256]float32) {
	for c := range t {
		mag := uint8(c) &^ f.signBit
		var v float64
		switch {
		case mag <= f.maxMag:
			v = f.magnitude(mag)
		case isNaN(mag):
			v = math.NaN()
		case hasInf:
			v = math.Inf(1)
		}
		if uint8(c)&f.signBit != 0 {
			v = -v
		}
		t[c] = float32(v)
	}
	return t
}

// FP8E4M3 decodes an OCP E4M3 ("FN") byte: bias 7, subnormals, no
// infinities, S.1111.111 is NaN, largest finite 448.
func FP8E4M3(b uint8) float32 { return e4m3Table[b] }

// FP8E5M2 decodes an OCP E5M2 byte: bias 15, subnormals, IEEE-like infinities
// (S.11111.00) and NaNs, largest finite 57344.
func FP8E5M2(b uint8) float32 { return e5m2Table[b] }
