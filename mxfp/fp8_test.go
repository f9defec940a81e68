package mxfp

import (
	"math"
	"testing"
)

// want8 is a hand-computed value of one fp8 code; nan marks NaN codes.
type want8 struct {
	code byte
	v    float64
	nan  bool
}

func checkFP8(t *testing.T, name string, dec func(byte) float32, hand []want8, bits func(c byte) (float32, bool)) {
	t.Helper()
	for _, h := range hand {
		got := dec(h.code)
		switch {
		case h.nan:
			if !math.IsNaN(float64(got)) {
				t.Errorf("%s(%#02x) = %v, want NaN", name, h.code, got)
			}
		case math.Float32bits(got) != math.Float32bits(float32(h.v)):
			t.Errorf("%s(%#02x) = %v, want %v", name, h.code, got, h.v)
		}
	}
	// Every code, rebuilt by moving its fields into a float32 bit pattern.
	for c := range 256 {
		want, nan := bits(byte(c))
		got := dec(byte(c))
		if nan {
			if !math.IsNaN(float64(got)) {
				t.Errorf("%s(%#02x) = %v, want NaN", name, c, got)
			}
			continue
		}
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Errorf("%s(%#02x) = %v (%08x), want %v (%08x)", name, c, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
}

func TestFP8E4M3AllCodes(t *testing.T) {
	negZero := math.Copysign(0, -1)
	hand := []want8{
		{0x00, 0, false}, {0x80, negZero, false},
		{0x01, 0.001953125, false}, {0x07, 0.013671875, false}, // subnormals: m x 2^-9
		{0x08, 0.015625, false}, // smallest normal 2^-6
		{0x38, 1, false}, {0x3C, 1.5, false}, {0x40, 2, false}, {0xB8, -1, false},
		{0x78, 256, false}, {0x7D, 416, false}, {0x7E, 448, false}, {0xFE, -448, false},
		{0x7F, 0, true}, {0xFF, 0, true}, // S.1111.111 is the only NaN
		{0x77, 240, false}, {0x79, 288, false}, // no infinities: exponent 15 holds finite values
	}
	sub := [8]float32{0, 0.001953125, 0.00390625, 0.005859375, 0.0078125, 0.009765625, 0.01171875, 0.013671875}
	checkFP8(t, "FP8E4M3", FP8E4M3, hand, func(c byte) (float32, bool) {
		s, e, m := uint32(c>>7), uint32(c>>3)&0xF, uint32(c&7)
		if e == 15 && m == 7 {
			return 0, true
		}
		if e == 0 {
			return math.Float32frombits(s<<31 | math.Float32bits(sub[m])), false
		}
		return math.Float32frombits(s<<31 | (e-7+127)<<23 | m<<20), false
	})
}

func TestFP8E5M2AllCodes(t *testing.T) {
	hand := []want8{
		{0x00, 0, false}, {0x80, math.Copysign(0, -1), false},
		{0x01, 1.52587890625e-05, false}, {0x03, 4.57763671875e-05, false}, // subnormals: m x 2^-16
		{0x04, 6.103515625e-05, false}, // smallest normal 2^-14
		{0x3C, 1, false}, {0x3E, 1.5, false}, {0xC0, -2, false},
		{0x7B, 57344, false}, {0xFB, -57344, false},
		{0x7C, math.Inf(1), false}, {0xFC, math.Inf(-1), false},
		{0x7D, 0, true}, {0x7E, 0, true}, {0x7F, 0, true}, {0xFD, 0, true}, {0xFF, 0, true},
	}
	sub := [4]float32{0, 1.52587890625e-05, 3.0517578125e-05, 4.57763671875e-05}
	checkFP8(t, "FP8E5M2", FP8E5M2, hand, func(c byte) (float32, bool) {
		s, e, m := uint32(c>>7), uint32(c>>2)&0x1F, uint32(c&3)
		switch {
		case e == 31 && m != 0:
			return 0, true
		case e == 31:
			return math.Float32frombits(s<<31 | 0x7F800000), false
		case e == 0:
			return math.Float32frombits(s<<31 | math.Float32bits(sub[m])), false
		}
		return math.Float32frombits(s<<31 | (e-15+127)<<23 | m<<21), false
	})
}

func TestDequantMXFP8(t *testing.T) {
	elems := make([]byte, 64)
	for i := range elems {
		elems[i] = byte(i * 4)
	}
	scales := []byte{127, 130} // x1, x8
	for _, e5 := range []bool{false, true} {
		dec := FP8E4M3
		if e5 {
			dec = FP8E5M2
		}
		got := make([]float32, 64)
		DequantMXFP8(got, elems, scales, e5)
		for j, b := range elems {
			want := dec(b) * float32(math.Ldexp(1, int(scales[j/32])-127))
			if math.Float32bits(got[j]) != math.Float32bits(want) && !(math.IsNaN(float64(got[j])) && math.IsNaN(float64(want))) {
				t.Errorf("e5m2=%v col %d (code %#02x): got %v, want %v", e5, j, b, got[j], want)
			}
		}
	}
	// 0x7E (448) x 2^127 overflows float32; E5M2 infinities stay infinite.
	got := make([]float32, 32)
	DequantMXFP8(got, append([]byte{0x7E}, make([]byte, 31)...), []byte{254}, false)
	if !math.IsInf(float64(got[0]), 1) || got[1] != 0 {
		t.Errorf("448 x 2^127 = %v (want +Inf), 0 x 2^127 = %v", got[0], got[1])
	}
}

func TestDotMXFP8MatchesExactDot(t *testing.T) {
	for _, e5 := range []bool{false, true} {
		dec := FP8E4M3
		if e5 {
			dec = FP8E5M2
		}
		n := 3584
		elems, scales, x := make([]byte, n), make([]byte, n/32), make([]float32, n)
		seed := uint32(7)
		next := func() uint32 { seed = seed*1664525 + 1013904223; return seed >> 8 }
		for i := range elems {
			b := byte(next())
			for math.IsNaN(float64(dec(b))) || math.IsInf(float64(dec(b)), 0) {
				b = byte(next())
			}
			elems[i] = b
			x[i] = float32(int(next()%2001)-1000) / 997
		}
		for i := range scales {
			scales[i] = byte(100 + next()%40)
		}
		w := func(j int) float64 {
			return float64(dec(elems[j])) * math.Ldexp(1, int(scales[j/32])-127)
		}
		want, abs := refDot(w, x)
		got := DotMXFP8(elems, scales, x, e5)
		if d := math.Abs(float64(got) - want); d > dotTolerance(n, abs) {
			t.Errorf("e5m2=%v: DotMXFP8 = %v, exact %v, error %g > %g", e5, got, want, d, dotTolerance(n, abs))
		}
		// The same row decoded first and dotted in float64 agrees too.
		row := make([]float32, n)
		DequantMXFP8(row, elems, scales, e5)
		for j := range row {
			if float64(row[j]) != w(j) {
				t.Fatalf("e5m2=%v col %d: dequant %v, exact %v", e5, j, row[j], w(j))
			}
		}
	}
	// NaN elements and NaN scales propagate.
	x := make([]float32, 32)
	for i := range x {
		x[i] = 1
	}
	e := make([]byte, 32)
	e[5] = 0x7F
	if got := DotMXFP8(e, []byte{127}, x, false); !math.IsNaN(float64(got)) {
		t.Errorf("E4M3 NaN element: dot = %v, want NaN", got)
	}
	if got := DotMXFP8(make([]byte, 32), []byte{ScaleNaN}, x, true); !math.IsNaN(float64(got)) {
		t.Errorf("NaN scale: dot = %v, want NaN", got)
	}
}
