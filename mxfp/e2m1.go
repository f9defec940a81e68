package mxfp

import "math"

// E2M1 is the value of each 4-bit MXFP4 element code: bit 3 sign, bits 2..1
// exponent (bias 1), bit 0 mantissa. Code 8 is -0. The kernels use a private
// copy, so changing this table does not change their results.
var E2M1 = e2m1Table()

func e2m1Table() (t [16]float32) {
	for c := range t {
		v := fmtE2M1.magnitude(uint8(c) & 0x7)
		if c&0x8 != 0 {
			v = math.Copysign(v, -1)
		}
		t[c] = float32(v)
	}
	return t
}

// fp4Pairs maps a packed byte to its two elements: the low nibble is the even
// column, the high nibble the odd one (K3-SPEC 5.4).
var fp4Pairs = func() (t [256][2]float32) {
	e := e2m1Table()
	for b := range t {
		t[b] = [2]float32{e[b&0xF], e[b>>4]}
	}
	return t
}()
