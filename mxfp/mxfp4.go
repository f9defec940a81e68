package mxfp

import (
	"fmt"
	"math"
)

// DequantMXFP4 decodes one row: dst[j] = E2M1[nibble j] x 2^(scales[j/32]-127),
// the even column in the low nibble of packed[j/2]. It panics unless
// len(dst) = 2 x len(packed) = 32 x len(scales).
func DequantMXFP4(dst []float32, packed, scales []byte) {
	checkMXFP4(len(dst), len(packed), len(scales))
	for k, s := range scales {
		m := e8m0[s]
		p := (*[BlockSize / 2]byte)(packed[k*BlockSize/2:])
		d := (*[BlockSize]float32)(dst[k*BlockSize:])
		for i, b := range p {
			pr := &fp4Pairs[b]
			d[2*i] = pr[0] * m
			d[2*i+1] = pr[1] * m
		}
	}
}

// DotMXFP4 returns the dot product of one MXFP4 row with x without decoding
// the row: each block's 32 products are summed unscaled and the block's scale
// is applied once. That is exact scaling except at the float32 range edges:
// with scale 254 a block whose decoded weights would overflow still sums
// finitely, and with scale 0 a block sum may lose bits below 2^-149. It
// allocates nothing and panics unless len(x) = 2 x len(packed) = 32 x
// len(scales).
func DotMXFP4(packed, scales []byte, x []float32) float32 {
	checkMXFP4(len(x), len(packed), len(scales))
	var sum float32
	for k, s := range scales {
		p := (*[BlockSize / 2]byte)(packed[k*BlockSize/2:])
		v := (*[BlockSize]float32)(x[k*BlockSize:])
		// Unrolled with constant offsets and eight independent accumulators:
		// the adds do not wait on each other and no index is recomputed.
		var a0, a1, a2, a3, a4, a5, a6, a7 float32
		q0, q1, q2, q3 := &fp4Pairs[p[0]], &fp4Pairs[p[1]], &fp4Pairs[p[2]], &fp4Pairs[p[3]]
		a0 += float32(q0[0] * v[0])
		a1 += float32(q0[1] * v[1])
		a2 += float32(q1[0] * v[2])
		a3 += float32(q1[1] * v[3])
		a4 += float32(q2[0] * v[4])
		a5 += float32(q2[1] * v[5])
		a6 += float32(q3[0] * v[6])
		a7 += float32(q3[1] * v[7])
		q0, q1, q2, q3 = &fp4Pairs[p[4]], &fp4Pairs[p[5]], &fp4Pairs[p[6]], &fp4Pairs[p[7]]
		a0 += float32(q0[0] * v[8])
		a1 += float32(q0[1] * v[9])
		a2 += float32(q1[0] * v[10])
		a3 += float32(q1[1] * v[11])
		a4 += float32(q2[0] * v[12])
		a5 += float32(q2[1] * v[13])
		a6 += float32(q3[0] * v[14])
		a7 += float32(q3[1] * v[15])
		q0, q1, q2, q3 = &fp4Pairs[p[8]], &fp4Pairs[p[9]], &fp4Pairs[p[10]], &fp4Pairs[p[11]]
		a0 += float32(q0[0] * v[16])
		a1 += float32(q0[1] * v[17])
		a2 += float32(q1[0] * v[18])
		a3 += float32(q1[1] * v[19])
		a4 += float32(q2[0] * v[20])
		a5 += float32(q2[1] * v[21])
		a6 += float32(q3[0] * v[22])
		a7 += float32(q3[1] * v[23])
		q0, q1, q2, q3 = &fp4Pairs[p[12]], &fp4Pairs[p[13]], &fp4Pairs[p[14]], &fp4Pairs[p[15]]
		a0 += float32(q0[0] * v[24])
		a1 += float32(q0[1] * v[25])
		a2 += float32(q1[0] * v[26])
		a3 += float32(q1[1] * v[27])
		a4 += float32(q2[0] * v[28])
		a5 += float32(q2[1] * v[29])
		a6 += float32(q3[0] * v[30])
		a7 += float32(q3[1] * v[31])
		sum += float32(((a0 + a1) + (a2 + a3) + ((a4 + a5) + (a6 + a7))) * e8m0[s])
	}
	return sum
}

// QuantizeMXFP4 encodes one row by the OCP MX rule: each block of 32 gets the
// scale 2^(floor(log2(max|v|)) - 2) (2 is E2M1's largest exponent), and each
// element is v / scale rounded to the nearest E2M1 value, ties to even,
// saturating at +-6. An all-zero block gets scale 127; a block holding a NaN
// or an infinity gets the NaN scale 255 and zero elements. It panics unless
// len(src) = 2 x len(packed) = 32 x len(scales).
func QuantizeMXFP4(packed, scales []byte, src []float32) {
	checkMXFP4(len(src), len(packed), len(scales))
	for k := range scales {
		blk := (*[BlockSize]float32)(src[k*BlockSize:])
		s := blockScale(blk, fmtE2M1.emax)
		scales[k] = s
		p := (*[BlockSize / 2]byte)(packed[k*BlockSize/2:])
		if s == ScaleNaN {
			*p = [BlockSize / 2]byte{}
			continue
		}
		shift := 127 - int(s)
		for i := range p {
			lo := fmtE2M1.encode(math.Ldexp(float64(blk[2*i]), shift))
			hi := fmtE2M1.encode(math.Ldexp(float64(blk[2*i+1]), shift))
			p[i] = lo | hi<<4
		}
	}
}

func checkMXFP4(n, packed, scales int) {
	if n != 2*packed || n != BlockSize*scales {
		panic(fmt.Sprintf("mxfp: an MXFP4 row of %d values needs %d packed bytes and %d scales, have %d and %d",
			n, n/2, n/BlockSize, packed, scales))
	}
}
