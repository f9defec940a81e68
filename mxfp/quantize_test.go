package mxfp

import (
	"math"
	"math/rand/v2"
	"testing"
)

// nearestCode finds, by trying every finite magnitude, the code closest to
// |v| (ties to the even code) and applies v's sign: the OCP conversion
// written as a search, independent of the encoder's bit arithmetic.
func nearestCode(v float64, mags []float64, signBit byte) byte {
	a := math.Abs(v)
	best, bestD := 0, math.Inf(1)
	for c, m := range mags {
		d := math.Abs(a - m)
		if d < bestD || d == bestD && c%2 == 0 {
			best, bestD = c, d
		}
	}
	if math.Signbit(v) {
		return byte(best) | signBit
	}
	return byte(best)
}

// ocpScale is 127 + floor(log2(amax)) - emax, clamped, by way of math.Log2.
func ocpScale(blk []float32, emax int) byte {
	var amax float64
	for _, v := range blk {
		amax = max(amax, math.Abs(float64(v)))
	}
	if amax == 0 {
		return 127
	}
	return byte(min(max(127+int(math.Floor(math.Log2(amax)))-emax, 0), 254))
}

// testBlocks returns blocks of 32 values: random magnitudes across the
// float32 range, exact ties between neighbouring codes, values past the
// element maximum, zeros and subnormals.
func testBlocks(rng *rand.Rand, mags []float64, emax int) [][]float32 {
	var out [][]float32
	for range 400 {
		blk := make([]float32, 32)
		e := rng.IntN(60) - 30
		if rng.IntN(10) == 0 {
			e = rng.IntN(250) - 135 // extremes: scale clamps, subnormals
		}
		for i := range blk {
			v := math.Ldexp(rng.Float64()*2, e)
			if i%3 == 0 { // an exact midpoint of two codes at the block's scale
				top := math.Ldexp(1, e)
				_, fe := math.Frexp(top)
				c := rng.IntN(len(mags) - 1)
				v = math.Ldexp((mags[c]+mags[c+1])/2, fe-1-emax)
			}
			if rng.IntN(2) == 0 {
				v = -v
			}
			blk[i] = float32(v)
		}
		if rng.IntN(8) == 0 {
			blk[rng.IntN(32)] = 0
		}
		out = append(out, blk)
	}
	out = append(out, make([]float32, 32)) // all zero
	return out
}

func checkQuantize(t *testing.T, name string, f minifloat, quantize func(elems, scales []byte, src []float32), element func(elems []byte, i int) byte) {
	var mags []float64
	for c := uint8(0); c <= f.maxMag; c++ {
		mags = append(mags, f.magnitude(c))
	}
	rng := rand.New(rand.NewPCG(3, uint64(f.bias)))
	for _, blk := range testBlocks(rng, mags, f.emax) {
		elems := make([]byte, 32)
		if f == fmtE2M1 {
			elems = elems[:16]
		}
		scales := make([]byte, 1)
		quantize(elems, scales, blk)
		if want := ocpScale(blk, f.emax); scales[0] != want {
			t.Fatalf("%s block %v: scale %d, OCP rule gives %d", name, blk, scales[0], want)
		}
		for i, v := range blk {
			scaled := math.Ldexp(float64(v), 127-int(scales[0]))
			want := nearestCode(scaled, mags, f.signBit)
			if got := element(elems, i); got != want {
				t.Fatalf("%s: %v (x 2^%d = %v) encoded as %#02x, nearest is %#02x", name, v, 127-int(scales[0]), scaled, got, want)
			}
		}
	}
}

func TestQuantizeMXFP4MatchesNearestSearch(t *testing.T) {
	checkQuantize(t, "MXFP4", fmtE2M1, QuantizeMXFP4, func(p []byte, i int) byte {
		if i%2 == 0 {
			return p[i/2] & 0xF
		}
		return p[i/2] >> 4
	})
}

func TestQuantizeMXFP8MatchesNearestSearch(t *testing.T) {
	elem := func(e []byte, i int) byte { return e[i] }
	checkQuantize(t, "E4M3", fmtE4M3, func(e, s []byte, src []float32) { QuantizeMXFP8(e, s, src, false) }, elem)
	checkQuantize(t, "E5M2", fmtE5M2, func(e, s []byte, src []float32) { QuantizeMXFP8(e, s, src, true) }, elem)
}

func TestQuantizeNonFiniteBlock(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		src := make([]float32, 64)
		for i := range src {
			src[i] = 1
		}
		src[40] = bad
		p, s := make([]byte, 32), make([]byte, 2)
		QuantizeMXFP4(p, s, src)
		if s[0] != 125 || s[1] != ScaleNaN {
			t.Errorf("MXFP4 with %v in block 1: scales %v, want [125 255]", bad, s)
		}
		e := make([]byte, 64)
		QuantizeMXFP8(e, s, src, false)
		if s[0] != 119 || s[1] != ScaleNaN || CheckScales(s) == nil {
			t.Errorf("MXFP8 with %v in block 1: scales %v, want [119 255]", bad, s)
		}
	}
}

// Quantize then dequantize stays within half a code step of each value, plus
// whatever was cut off by saturating at the element maximum (the OCP rule
// saturates a block's largest values).
func TestQuantizeRoundTripError(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	src := make([]float32, 3584)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 0.02)
	}
	p, s, back := make([]byte, 1792), make([]byte, 112), make([]float32, 3584)
	QuantizeMXFP4(p, s, src)
	DequantMXFP4(back, p, s)
	e, back8 := make([]byte, 3584), make([]float32, 3584)
	s8 := make([]byte, 112)
	QuantizeMXFP8(e, s8, src, false)
	DequantMXFP8(back8, e, s8, false)
	for i, v := range src {
		scale := math.Ldexp(1, int(s[i/32])-127)
		// E2M1 steps are at most 2 (between 4 and 6) in element units; values
		// up to 8 x scale saturate at 6.
		if d := math.Abs(float64(back[i] - v)); d > 2*scale {
			t.Fatalf("MXFP4 col %d: %v came back as %v", i, v, back[i])
		}
		scale8 := math.Ldexp(1, int(s8[i/32])-127)
		cut := max(0, math.Abs(float64(v))-448*scale8)
		if d := math.Abs(float64(back8[i] - v)); d > math.Abs(float64(v))/16+scale8*0x1p-10+cut {
			t.Fatalf("MXFP8 col %d: %v came back as %v", i, v, back8[i])
		}
	}
}
