package mxfp

import (
	"fmt"
	"math"
)

// CheckScales reports the first NaN scale (255) in a row or tensor of E8M0
// scales, by its position; the OCP MX specification makes every element of
// such a block NaN.
func CheckScales(scales []byte) error {
	for i, s := range scales {
		if s == ScaleNaN {
			return fmt.Errorf("mxfp: scale %d of %d is 255 (NaN): its block of %d elements decodes to NaN", i, len(scales), BlockSize)
		}
	}
	return nil
}

// blockScale returns the OCP MX shared scale of one block: 127 +
// floor(log2(max|v|)) - emax, clamped to the E8M0 range 0..254. A block with
// a NaN or an infinity gets ScaleNaN; an all-zero block gets 127.
func blockScale(blk *[BlockSize]float32, emax int) uint8 {
	var amax float64
	for _, v := range blk {
		a := math.Abs(float64(v))
		if a > math.MaxFloat32 || a != a {
			return ScaleNaN
		}
		amax = max(amax, a)
	}
	if amax == 0 {
		return 127
	}
	_, e := math.Frexp(amax) // amax = frac x 2^e with frac in [0.5, 1)
	return uint8(min(max(127+e-1-emax, 0), 254))
}
