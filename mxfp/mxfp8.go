package mxfp

import (
	"fmt"
	"math"
)

// fp8 returns the decode table and the format of the chosen element type.
func fp8(e5m2 bool) (*[256]float32, minifloat) {
	if e5m2 {
		return &e5m2Table, fmtE5M2
	}
	return &e4m3Table, fmtE4M3
}

// DequantMXFP8 decodes one row: dst[j] = fp8(elems[j]) x 2^(scales[j/32]-127),
// fp8 being E5M2 when e5m2 is set and E4M3 otherwise. It panics unless
// len(dst) = len(elems) = 32 x len(scales).
func DequantMXFP8(dst []float32, elems, scales []byte, e5m2 bool) {
	checkMXFP8(len(dst), len(elems), len(scales))
	t, _ := fp8(e5m2)
	for k, s := range scales {
		m := e8m0[s]
		e := (*[BlockSize]byte)(elems[k*BlockSize:])
		d := (*[BlockSize]float32)(dst[k*BlockSize:])
		for i, b := range e {
			d[i] = t[b] * m
		}
	}
}

// DotMXFP8 returns the dot product of one MXFP8 row with x without decoding
// the row; each block's scale is applied once to its partial sum. It
// allocates nothing and panics unless len(x) = len(elems) = 32 x len(scales).
func DotMXFP8(elems, scales []byte, x []float32, e5m2 bool) float32 {
	checkMXFP8(len(x), len(elems), len(scales))
	t, _ := fp8(e5m2)
	var sum float32
	for k, s := range scales {
		e := (*[BlockSize]byte)(elems[k*BlockSize:])
		v := (*[BlockSize]float32)(x[k*BlockSize:])
		// Unrolled with constant offsets and eight independent accumulators,
		// as in DotMXFP4.
		var a0, a1, a2, a3, a4, a5, a6, a7 float32
		a0 += float32(t[e[0]] * v[0])
		a1 += float32(t[e[1]] * v[1])
		a2 += float32(t[e[2]] * v[2])
		a3 += float32(t[e[3]] * v[3])
		a4 += float32(t[e[4]] * v[4])
		a5 += float32(t[e[5]] * v[5])
		a6 += float32(t[e[6]] * v[6])
		a7 += float32(t[e[7]] * v[7])
		a0 += float32(t[e[8]] * v[8])
		a1 += float32(t[e[9]] * v[9])
		a2 += float32(t[e[10]] * v[10])
		a3 += float32(t[e[11]] * v[11])
		a4 += float32(t[e[12]] * v[12])
		a5 += float32(t[e[13]] * v[13])
		a6 += float32(t[e[14]] * v[14])
		a7 += float32(t[e[15]] * v[15])
		a0 += float32(t[e[16]] * v[16])
		a1 += float32(t[e[17]] * v[17])
		a2 += float32(t[e[18]] * v[18])
		a3 += float32(t[e[19]] * v[19])
		a4 += float32(t[e[20]] * v[20])
		a5 += float32(t[e[21]] * v[21])
		a6 += float32(t[e[22]] * v[22])
		a7 += float32(t[e[23]] * v[23])
		a0 += float32(t[e[24]] * v[24])
		a1 += float32(t[e[25]] * v[25])
		a2 += float32(t[e[26]] * v[26])
		a3 += float32(t[e[27]] * v[27])
		a4 += float32(t[e[28]] * v[28])
		a5 += float32(t[e[29]] * v[29])
		a6 += float32(t[e[30]] * v[30])
		a7 += float32(t[e[31]] * v[31])
		sum += float32(((a0 + a1) + (a2 + a3) + ((a4 + a5) + (a6 + a7))) * e8m0[s])
	}
	return sum
}

// QuantizeMXFP8 encodes one row by the OCP MX rule: each block's scale is
// 2^(floor(log2(max|v|)) - emax) with emax 8 (E4M3) or 15 (E5M2), and each
// element is rounded to the nearest fp8 value, ties to even, saturating at the
// largest finite value (448 or 57344). Zero, NaN and infinite blocks are
// handled as in QuantizeMXFP4. It panics unless len(src) = len(elems) = 32 x
// len(scales).
func QuantizeMXFP8(elems, scales []byte, src []float32, e5m2 bool) {
	checkMXFP8(len(src), len(elems), len(scales))
	_, f := fp8(e5m2)
	for k := range scales {
		blk := (*[BlockSize]float32)(src[k*BlockSize:])
		s := blockScale(blk, f.emax)
		scales[k] = s
		e := (*[BlockSize]byte)(elems[k*BlockSize:])
		if s == ScaleNaN {
			*e = [BlockSize]byte{}
			continue
		}
		shift := 127 - int(s)
		for i, v := range blk {
			e[i] = f.encode(math.Ldexp(float64(v), shift))
		}
	}
}

func checkMXFP8(n, elems, scales int) {
	if n != elems || n != BlockSize*scales {
		panic(fmt.Sprintf("mxfp: an MXFP8 row of %d values needs %d elements and %d scales, have %d and %d",
			n, n, n/BlockSize, elems, scales))
	}
}
