package mxfp

import (
	"math"
	"testing"
)

func TestBF16Exhaustive(t *testing.T) {
	for u := range 1 << 16 {
		h := uint16(u)
		f := BF16ToF32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) bits %08x", h, math.Float32bits(f))
		}
		back := F32ToBF16(f)
		if f != f {
			if BF16ToF32(back) == BF16ToF32(back) || back>>15 != h>>15 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != h {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, f, back)
		}
		if h&0x7F80 == 0x7F80 { // infinity: no upper neighbour
			continue
		}
		// Halfway to the next magnitude, and one float32 ulp either side.
		mid := uint32(h)<<16 | 0x8000
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		if got := F32ToBF16(math.Float32frombits(mid)); got != even {
			t.Fatalf("tie between %#04x and %#04x rounded to %#04x, want %#04x", h, h+1, got, even)
		}
		if got := F32ToBF16(math.Float32frombits(mid - 1)); got != h {
			t.Fatalf("just below the tie above %#04x rounded to %#04x", h, got)
		}
		if got := F32ToBF16(math.Float32frombits(mid + 1)); got != h+1 {
			t.Fatalf("just above the tie above %#04x rounded to %#04x", h, got)
		}
	}
}

func TestBF16Cases(t *testing.T) {
	cases := []struct {
		f    float32
		want uint16
	}{
		{1, 0x3F80}, {-2, 0xC000}, {math.MaxFloat32, 0x7F80}, // rounds up past the largest bf16
		{float32(math.Inf(-1)), 0xFF80}, {1.00390625, 0x3F80}, // 1 + 2^-8: tie, to even
		{1.01171875, 0x3F82},                       // 1 + 3 x 2^-8: tie, to even (up)
		{math.Float32frombits(0x7F800001), 0x7FC0}, // NaN with a low payload stays NaN
		{math.Float32frombits(0xFF800001), 0xFFC0},
	}
	for _, c := range cases {
		if got := F32ToBF16(c.f); got != c.want {
			t.Errorf("F32ToBF16(%v / %08x) = %#04x, want %#04x", c.f, math.Float32bits(c.f), got, c.want)
		}
	}
}

// f16Value decodes a binary16 from its fields in float64, independently of
// F16ToF32.
func f16Value(h uint16) float64 {
	s, e, m := h>>15, int(h>>10)&0x1F, float64(h&0x3FF)
	var v float64
	switch {
	case e == 31 && m != 0:
		return math.NaN()
	case e == 31:
		v = math.Inf(1)
	case e == 0:
		v = math.Ldexp(m, -24)
	default:
		v = math.Ldexp(1+m/1024, e-15)
	}
	if s == 1 {
		v = math.Copysign(v, -1)
	}
	return v
}

func TestF16Exhaustive(t *testing.T) {
	for u := range 1 << 16 {
		h := uint16(u)
		f := F16ToF32(h)
		want := f16Value(h)
		if math.IsNaN(want) {
			if f == f || math.Signbit(float64(f)) != (h>>15 == 1) {
				t.Fatalf("F16ToF32(%#04x) = %v, want a NaN of the same sign", h, f)
			}
			back := F32ToF16(f)
			if back&0x7C00 != 0x7C00 || back&0x3FF == 0 || back>>15 != h>>15 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if math.Float32bits(f) != math.Float32bits(float32(want)) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, f, want)
		}
		if back := F32ToF16(f); back != h {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, back)
		}
		if h&0x7C00 == 0x7C00 {
			continue
		}
		// Ties between h and the next magnitude go to the even code; a
		// float32 ulp either side decides. 0x7BFF's neighbour is infinity
		// (the tie 65520 rounds to it, as binary16 overflow requires).
		next := f16Value(h + 1)
		if h&0x7FFF == 0x7BFF {
			next = math.Copysign(65536, want)
		}
		mid := float32((want + next) / 2)
		if float64(mid) != (want+next)/2 {
			t.Fatalf("midpoint of %#04x not exact in float32", h)
		}
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		if got := F32ToF16(mid); got != even {
			t.Fatalf("tie between %#04x and %#04x rounded to %#04x, want %#04x", h, h+1, got, even)
		}
		toward := float32(math.Copysign(0, float64(mid)))
		if got := F32ToF16(math.Nextafter32(mid, toward)); got != h {
			t.Fatalf("just inside the tie above %#04x rounded to %#04x", h, got)
		}
		away := float32(math.Copysign(math.Inf(1), float64(mid)))
		if got := F32ToF16(math.Nextafter32(mid, away)); got != h+1 {
			t.Fatalf("just outside the tie above %#04x rounded to %#04x", h, got)
		}
	}
}

func TestF16Cases(t *testing.T) {
	cases := []struct {
		f    float32
		want uint16
	}{
		{1, 0x3C00}, {-2, 0xC000}, {65504, 0x7BFF}, {65519.996, 0x7BFF}, {65520, 0x7C00}, {1e6, 0x7C00},
		{float32(math.Inf(-1)), 0xFC00}, {6.103515625e-05, 0x0400}, {5.9604645e-08, 0x0001},
		{2.98023224e-08, 0x0000},                                        // 2^-25: tie between 0 and the smallest subnormal, to even
		{2.9802326e-08, 0x0001},                                         // just above
		{1e-10, 0x0000}, {-1e-10, 0x8000}, {math.Float32frombits(1), 0}, // float32 subnormal
		{math.Float32frombits(0x7F800001), 0x7E00},
	}
	for _, c := range cases {
		if got := F32ToF16(c.f); got != c.want {
			t.Errorf("F32ToF16(%v / %08x) = %#04x, want %#04x", c.f, math.Float32bits(c.f), got, c.want)
		}
	}
}
