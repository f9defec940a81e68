package mxfp

import "math"

// BF16ToF32 widens a bfloat16 (the top half of a float32); exact.
func BF16ToF32(u uint16) float32 { return math.Float32frombits(uint32(u) << 16) }

// F32ToBF16 rounds to the nearest bfloat16, ties to even. Overflow gives
// infinity; a NaN stays a NaN of the same sign (its quiet bit is set, since
// truncating a payload held only in the low bits would make it infinity).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7FFFFFFF > 0x7F800000 {
		return uint16(b>>16) | 0x0040
	}
	b += 0x7FFF + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToF32 widens an IEEE 754 binary16; exact, subnormals included.
func F16ToF32(u uint16) float32 {
	sign := uint32(u&0x8000) << 16
	exp := uint32(u>>10) & 0x1F
	man := uint32(u & 0x3FF)
	switch {
	case exp == 0x1F: // infinity or NaN, payload kept
		return math.Float32frombits(sign | 0x7F800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
	}
	// Zero or subnormal: man x 2^-24, exact in float32.
	v := float32(man) * (1.0 / (1 << 24))
	return math.Float32frombits(sign | math.Float32bits(v))
}

// F32ToF16 rounds to the nearest IEEE 754 binary16, ties to even, with
// subnormals; overflow gives infinity and a NaN stays a quiet NaN.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xFF
	man := b & 0x7FFFFF
	if exp == 0xFF {
		if man != 0 {
			return sign | 0x7E00 | uint16(man>>13)
		}
		return sign | 0x7C00
	}
	e := exp - 127
	switch {
	case e > 15:
		return sign | 0x7C00
	case e >= -14: // normal in binary16; a carry out of the mantissa may reach infinity, correctly
		h := uint32(e+15)<<10 | man>>13
		rem := man & 0x1FFF
		if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	case e < -25: // below half the smallest subnormal (2^-25): rounds to zero
		return sign
	}
	// Subnormal in binary16: count units of 2^-24, rounding the shifted-out bits.
	m := man | 0x800000
	shift := uint(-1 - e) // 14..24
	h := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || rem == half && h&1 == 1 {
		h++
	}
	return sign | uint16(h)
}
