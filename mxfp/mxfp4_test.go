package mxfp

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
)

type jsonTensor struct {
	Shape []int     `json:"shape"`
	Data  []float64 `json:"data"`
}

type mxfp4Fixture struct {
	Rows      int        `json:"rows"`
	Packed    jsonTensor `json:"packed"`
	Scales    jsonTensor `json:"scales"`
	Expected  jsonTensor `json:"expected"`
	LUT       []float64  `json:"e2m1_lut"`
	GroupSize int        `json:"group_size"`
	Swapped   struct {
		First64 []float64 `json:"first64"`
	} `json:"expected_swapped_nibbles"`
}

type mxfp4Rows struct {
	fx             mxfp4Fixture
	packed, scales [][]byte
	want           [][]float32
}

// fixtureRows parses the 2.8 MB fixture once for all tests.
var fixtureRows = sync.OnceValues(func() (*mxfp4Rows, error) {
	b, err := os.ReadFile("testdata/mxfp4.json")
	if err != nil {
		return nil, err
	}
	r := &mxfp4Rows{}
	fx := &r.fx
	if err := json.Unmarshal(b, fx); err != nil {
		return nil, fmt.Errorf("testdata/mxfp4.json: %w", err)
	}
	if fx.GroupSize != BlockSize || len(fx.Packed.Shape) != 2 || fx.Packed.Shape[0] != fx.Rows {
		return nil, fmt.Errorf("unexpected fixture layout: group %d, packed shape %v", fx.GroupSize, fx.Packed.Shape)
	}
	rows, pc, sc := fx.Rows, fx.Packed.Shape[1], fx.Scales.Shape[1]
	for i := range rows {
		p := make([]byte, pc)
		for j := range p {
			p[j] = byte(fx.Packed.Data[i*pc+j])
		}
		s := make([]byte, sc)
		for j := range s {
			s[j] = byte(fx.Scales.Data[i*sc+j])
		}
		w := make([]float32, 2*pc)
		for j := range w {
			w[j] = float32(fx.Expected.Data[i*2*pc+j])
		}
		r.packed, r.scales, r.want = append(r.packed, p), append(r.scales, s), append(r.want, w)
	}
	return r, nil
})

// loadMXFP4 returns the released-bytes fixture: rows of packed bytes,
// scales and expected float32 values.
func loadMXFP4(t testing.TB) (fx mxfp4Fixture, packed, scales [][]byte, want [][]float32) {
	t.Helper()
	r, err := fixtureRows()
	if err != nil {
		t.Fatal(err)
	}
	return r.fx, r.packed, r.scales, r.want
}

func TestE2M1MatchesSpecTable(t *testing.T) {
	fx, _, _, _ := loadMXFP4(t)
	spec := [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, math.Copysign(0, -1), -0.5, -1, -1.5, -2, -3, -4, -6}
	for c := range 16 {
		if math.Float32bits(E2M1[c]) != math.Float32bits(float32(spec[c])) {
			t.Errorf("E2M1[%d] = %v, spec says %v", c, E2M1[c], spec[c])
		}
		if math.Float32bits(E2M1[c]) != math.Float32bits(float32(fx.LUT[c])) {
			t.Errorf("E2M1[%d] = %v, fixture lut says %v", c, E2M1[c], fx.LUT[c])
		}
	}
}

func TestDequantMXFP4FixtureExact(t *testing.T) {
	_, packed, scales, want := loadMXFP4(t)
	got := make([]float32, len(want[0]))
	for r := range packed {
		DequantMXFP4(got, packed[r], scales[r])
		for j := range got {
			if math.Float32bits(got[j]) != math.Float32bits(want[r][j]) {
				t.Fatalf("row %d col %d: got %v (bits %08x), want %v (bits %08x)",
					r, j, got[j], math.Float32bits(got[j]), want[r][j], math.Float32bits(want[r][j]))
			}
		}
	}
}

// The fixture's swapped-nibble case decodes the low nibble as the odd column.
// Our output must differ from it, and a decoder with that bug must reproduce
// it, which shows the check can catch the bug.
func TestDequantMXFP4RejectsSwappedNibbles(t *testing.T) {
	fx, packed, scales, _ := loadMXFP4(t)
	first := fx.Swapped.First64
	if len(first) != 64 {
		t.Fatalf("fixture has %d swapped values, want 64", len(first))
	}
	got := make([]float32, 2*len(packed[0]))
	DequantMXFP4(got, packed[0], scales[0])
	same := 0
	for j, v := range first {
		if math.Float32bits(got[j]) == math.Float32bits(float32(v)) {
			same++
		}
	}
	if same == len(first) {
		t.Fatal("our first 64 values equal the swapped-nibble decoding")
	}
	// A decoder with the bug: low nibble to the odd column.
	for j, v := range first {
		b := packed[0][j/2]
		n := b >> 4
		if j%2 == 1 {
			n = b & 0xF
		}
		bug := E2M1[n] * E8M0(scales[0][j/BlockSize])
		if math.Float32bits(bug) != math.Float32bits(float32(v)) {
			t.Fatalf("swapped decoder col %d = %v, fixture says %v: the negative case does not describe that bug", j, bug, v)
		}
	}
	t.Logf("%d of 64 swapped values coincide with ours (equal nibbles or zeros); the rest differ", same)
}

// The released quantizer picked scales so that max|v|/scale <= 6 (a third of
// its blocks top out at element 3), while the OCP rule used here picks the
// largest element exponent; both represent these weights exactly, so
// re-quantizing the released weights must be lossless.
func TestQuantizeMXFP4ReleasedWeightsLossless(t *testing.T) {
	_, packed, scales, want := loadMXFP4(t)
	p := make([]byte, len(packed[0]))
	s := make([]byte, len(scales[0]))
	got := make([]float32, len(want[0]))
	for r := range packed {
		QuantizeMXFP4(p, s, want[r])
		DequantMXFP4(got, p, s)
		for j := range got {
			if got[j] != want[r][j] {
				t.Fatalf("row %d col %d: re-quantized to %v, released %v", r, j, got[j], want[r][j])
			}
		}
	}
}

// refE2M1 is the spec's E2M1 table written out, independent of the package.
var refE2M1 = [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}

// refDot returns the float64 dot product of the exact weights with x and
// the sum of |w x|, for an error bound.
func refDot(w func(j int) float64, x []float32) (dot, abs float64) {
	for j, xv := range x {
		p := w(j) * float64(xv)
		dot += p
		abs += math.Abs(p)
	}
	return dot, abs
}

// dotTolerance bounds float32 blocked summation of n terms: a block of 32 is
// summed in a handful of steps (at most 12 for any sane split), blocks are
// added one after another, and a block sum scaled by 2^-127 may lose its bits
// below 2^-149.
func dotTolerance(n int, abs float64) float64 {
	steps := float64(n/BlockSize + 12)
	return 2*steps*0x1p-24*abs + float64(n/BlockSize)*0x1p-149
}

func TestDotMXFP4MatchesExactDot(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	_, fpacked, fscales, _ := loadMXFP4(t)
	type row struct {
		name           string
		packed, scales []byte
	}
	rows := []row{{"released row 0", fpacked[0], fscales[0]}, {"released row 63", fpacked[63], fscales[63]}}
	for _, n := range []int{32, 64, 3584, 7168} {
		p := make([]byte, n/2)
		s := make([]byte, n/BlockSize)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		for i := range s {
			s[i] = byte(110 + rng.IntN(30))
		}
		rows = append(rows, row{"random", p, s})
	}
	// Extremes of the scale range: 2^-127 (subnormal products) and 2^127
	// (products past float32 range when decoded, finite when fused).
	p := make([]byte, 64)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	rows = append(rows, row{"scale 0 and 1", p, []byte{0, 1, 0, 1}}, row{"scale 254", p, []byte{254, 254, 254, 254}})

	for _, r := range rows {
		n := 2 * len(r.packed)
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		if r.scales[0] == 254 {
			for i := range x {
				x[i] *= 0x1p-100
			}
		}
		w := func(j int) float64 {
			b := r.packed[j/2]
			if j%2 == 1 {
				b >>= 4
			}
			return refE2M1[b&0xF] * math.Ldexp(1, int(r.scales[j/BlockSize])-127)
		}
		want, abs := refDot(w, x)
		got := DotMXFP4(r.packed, r.scales, x)
		if d := math.Abs(float64(got) - want); d > dotTolerance(n, abs) || math.IsNaN(float64(got)) {
			t.Errorf("%s (n=%d): DotMXFP4 = %v, exact %v, error %g > %g", r.name, n, got, want, d, dotTolerance(n, abs))
		}
	}
}

func TestDotMXFP4NaNScale(t *testing.T) {
	p := make([]byte, 32)
	for i := range p {
		p[i] = 0x21
	}
	x := make([]float32, 64)
	for i := range x {
		x[i] = 1
	}
	if got := DotMXFP4(p, []byte{127, ScaleNaN}, x); !math.IsNaN(float64(got)) {
		t.Errorf("a NaN scale gave %v, want NaN", got)
	}
	d := make([]float32, 64)
	DequantMXFP4(d, p, []byte{127, ScaleNaN})
	if d[0] != 0.5 || d[1] != 1 || !math.IsNaN(float64(d[32])) {
		t.Errorf("dequant with scales 127, 255 gave %v, %v, %v; want 0.5, 1, NaN", d[0], d[1], d[32])
	}
}

func TestDotAllocatesNothing(t *testing.T) {
	p, s, x := make([]byte, 1792), make([]byte, 112), make([]float32, 3584)
	e := make([]byte, 3584)
	if n := testing.AllocsPerRun(20, func() { DotMXFP4(p, s, x) }); n != 0 {
		t.Errorf("DotMXFP4 allocates %v times per call", n)
	}
	if n := testing.AllocsPerRun(20, func() { DotMXFP8(e, s, x, false) }); n != 0 {
		t.Errorf("DotMXFP8 allocates %v times per call", n)
	}
}

func TestRowLengthMismatchPanicsWithReason(t *testing.T) {
	cases := []struct {
		name string
		f    func()
	}{
		{"DequantMXFP4 short packed", func() { DequantMXFP4(make([]float32, 64), make([]byte, 31), make([]byte, 2)) }},
		{"DotMXFP4 x not a block multiple", func() { DotMXFP4(make([]byte, 8), make([]byte, 1), make([]float32, 16)) }},
		{"QuantizeMXFP4 missing scale", func() { QuantizeMXFP4(make([]byte, 32), make([]byte, 1), make([]float32, 64)) }},
		{"DequantMXFP8 short elems", func() { DequantMXFP8(make([]float32, 64), make([]byte, 63), make([]byte, 2), false) }},
		{"DotMXFP8 extra scale", func() { DotMXFP8(make([]byte, 32), make([]byte, 2), make([]float32, 32), true) }},
		{"QuantizeMXFP8 short src", func() { QuantizeMXFP8(make([]byte, 32), make([]byte, 1), make([]float32, 31), false) }},
	}
	for _, c := range cases {
		func() {
			defer func() {
				r := recover()
				if s, ok := r.(string); !ok || !strings.Contains(s, "mxfp:") || !strings.Contains(s, "have") {
					t.Errorf("%s: recovered %v, want a panic naming the lengths", c.name, r)
				}
			}()
			c.f()
		}()
	}
}

func TestCheckScales(t *testing.T) {
	if err := CheckScales([]byte{0, 1, 127, 254}); err != nil {
		t.Errorf("valid scales: %v", err)
	}
	err := CheckScales([]byte{127, 127, 255, 255})
	if err == nil || !strings.Contains(err.Error(), "scale 2 of 4") {
		t.Errorf("NaN scale at 2: got %v", err)
	}
}

func TestE8M0AllCodes(t *testing.T) {
	for s := range 255 {
		want := float32(math.Ldexp(1, s-127))
		if got := E8M0(uint8(s)); got != want || got == 0 {
			t.Errorf("E8M0(%d) = %v, want 2^%d = %v", s, got, s-127, want)
		}
	}
	if got := E8M0(0); math.Float32bits(got) != 0x00400000 {
		t.Errorf("E8M0(0) bits %08x, want the subnormal 2^-127 (00400000)", math.Float32bits(got))
	}
	if got := E8M0(255); !math.IsNaN(float64(got)) {
		t.Errorf("E8M0(255) = %v, want NaN", got)
	}
}
