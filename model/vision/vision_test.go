package vision

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// Tolerance against the fp64 reference: the package keeps activations in
// fp32 between ops (MatMul accumulates in fp64, the host ops compute in
// fp64 and round once) and takes rotary angles in fp32 as the released code
// does, so each step adds a relative error of about 1e-7 and the small
// grids here keep angles below 10 radians (fp32 angle error < 1e-6). 1e-4
// of the output's scale leaves room for that through two blocks and the
// projector; every layout or order mistake (a swapped axis, a wrong
// concatenation, attention across images) moves outputs by O(1).
const tol = 1e-4

func TestTowerMatchesReference(t *testing.T) {
	// The presets' small tower (width 64, 2 blocks of 2 heads of 32, MLP
	// 128, 8x8 table), and testConfig's (head width 24, a 6x4 table).
	preset := K3(64)
	preset.Hidden, preset.Intermediate, preset.Layers, preset.Heads, preset.QKV = 64, 128, 2, 2, 64
	preset.PosH, preset.PosW = 8, 8
	for _, c := range []*Config{&preset, testConfig()} {
		t.Run(fmt.Sprintf("width%d-head%d", c.Hidden, c.HeadDim()), func(t *testing.T) { towerMatches(t, c) })
	}
}

func towerMatches(t *testing.T, c *Config) {
	tw, ts := loadTest(t, c, 1)
	r := ref{c: c, w: ts}
	// Three images packed in one call: a grid larger than the position table
	// in one axis and smaller in the other, one at exactly its size (no
	// resampling), and a small one.
	imgs := []Patches{randomPatches(c, c.PosH-2, c.PosW+4, 1), randomPatches(c, c.PosH, c.PosW, 2), randomPatches(c, 2, 2, 3)}
	got, err := tw.Features(context.Background(), imgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, im := range imgs {
		want := r.features(im)
		if len(got[i]) != c.Rows(im)*c.TextHidden {
			t.Fatalf("image %d: %d values, want %d rows of %d", i, len(got[i]), c.Rows(im), c.TextHidden)
		}
		if e := maxErr(got[i], want); e > tol {
			t.Fatalf("image %d (%dx%d): max error %.3g of scale, over %g", i, im.GridH, im.GridW, e, tol)
		}
	}
	// The planted bug: fp32's machine epsilon in the encoder norms instead
	// of BF16's (what a port computing in fp32 would pick up) is visible.
	fp32Eps := *c
	fp32Eps.NormEps = 0x1p-23
	if e := maxErr(got[0], ref{c: &fp32Eps, w: ts}.features(imgs[0])); e < 10*tol {
		t.Fatalf("the norms' eps changes the features by only %.3g: the test cannot tell 2^-7 from 2^-23", e)
	}
	// An image alone gives the same rows as in a batch: attention stays
	// inside each image.
	alone, err := tw.Features(context.Background(), imgs[2:])
	if err != nil {
		t.Fatal(err)
	}
	if e := maxErr(alone[0], toF64(got[2])); e > 1e-6 {
		t.Fatalf("the last image alone differs from the same image in a batch by %.3g", e)
	}
}

// TestExactSizePassthrough: at exactly the table's grid the table is added
// as is (the released code skips the resampling there).
func TestExactSizePassthrough(t *testing.T) {
	c := testConfig()
	table := make([]float32, c.PosH*c.PosW*c.Hidden)
	for i := range table {
		table[i] = float32(i)
	}
	got := positionTable(c, table, c.PosH, c.PosW)
	for i := range got {
		if got[i] != table[i] {
			t.Fatalf("element %d: %v, want %v", i, got[i], table[i])
		}
	}
}

// TestResampleClosedForm: bilinear resampling reproduces a constant table
// and a linear ramp a·y + b·x + c exactly, at the half-pixel-centre source
// coordinates (o + 0.5)·in/out − 0.5, clamped to [0, in − 1] (the upper
// clamp: the last input row is repeated there).
func TestResampleClosedForm(t *testing.T) {
	const inH, inW, d = 6, 5, 3
	constant := make([]float32, inH*inW*d)
	ramp := make([]float32, inH*inW*d)
	for y := 0; y < inH; y++ {
		for x := 0; x < inW; x++ {
			for k := 0; k < d; k++ {
				constant[(y*inW+x)*d+k] = 1.5
				ramp[(y*inW+x)*d+k] = float32(3*y - 2*x + k)
			}
		}
	}
	for _, g := range [][2]int{{12, 10}, {3, 2}, {7, 13}, {1, 1}, {6, 9}} {
		oh, ow := g[0], g[1]
		cst := resampleBilinear(constant, inH, inW, d, oh, ow)
		rmp := resampleBilinear(ramp, inH, inW, d, oh, ow)
		for oy := 0; oy < oh; oy++ {
			for ox := 0; ox < ow; ox++ {
				sy := math.Min(srcCoord(oy, inH, oh), inH-1)
				sx := math.Min(srcCoord(ox, inW, ow), inW-1)
				for k := 0; k < d; k++ {
					i := (oy*ow+ox)*d + k
					if cst[i] != 1.5 {
						t.Fatalf("%dx%d: constant table gives %v at (%d,%d)", oh, ow, cst[i], oy, ox)
					}
					want := 3*sy - 2*sx + float64(k)
					if math.Abs(float64(rmp[i])-want) > 1e-5 {
						t.Fatalf("%dx%d: ramp at (%d,%d,%d) is %v, want %v (source %.4f, %.4f)", oh, ow, oy, ox, k, rmp[i], want, sy, sx)
					}
				}
			}
		}
	}
	// Align-corners sampling (the other PyTorch convention) maps the first
	// and last outputs to the table's corners; half-pixel centres do not, so
	// an upsampled ramp's second output shows which convention ran.
	up := resampleBilinear(ramp, inH, inW, d, 12, 10)
	if got, wantHalfPixel := float64(up[(1*10+0)*d]), 3*(1.5*6.0/12-0.5); math.Abs(got-wantHalfPixel) > 1e-6 {
		t.Fatalf("ramp row 1: %v, want %v (half-pixel centres)", got, wantHalfPixel)
	}
}

// TestRopeLayout: a hand-built case. Head width 8 is four complex numbers
// (elements 0-1, 2-3, 4-5, 6-7) with frequencies 1, 1, 0.01, 0.01 (base
// 10000, 10000^(−4/8) = 0.01): numbers 0 and 2 turn by the column x, 1 and 3
// by the row y. Patch (y=2, x=3) of a 5-wide grid is patch 13.
func TestRopeLayout(t *testing.T) {
	const y, x, w = 2, 3, 5
	want := []float64{
		math.Cos(3), math.Sin(3), math.Cos(2), math.Sin(2),
		math.Cos(0.03), math.Sin(0.03), math.Cos(0.02), math.Sin(0.02),
	}
	rotated := func(tab ropeTable, p int) []float64 {
		v := []float32{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0} // two heads
		tab.rotate(v, p)
		out := make([]float64, len(v))
		for i := range v {
			out[i] = float64(v[i])
		}
		return out
	}
	got := rotated(newRopeTable(4, w, 8, 10000), y*w+x)
	for i := range got {
		if math.Abs(got[i]-want[i%8]) > 1e-6 {
			t.Fatalf("element %d (head %d): %v, want %v", i, i/8, got[i], want[i%8])
		}
	}
	// The planted bug: x and y swapped (the transposed grid puts the patch's
	// row where its column was) must fail the same check.
	swapped := rotated(newRopeTable(w, 4, 8, 10000), x*4+y)
	if math.Abs(swapped[0]-want[0]) < 1e-3 {
		t.Fatal("swapping the axes does not change element 0: the test cannot tell x from y")
	}
	// A rotation of a general vector matches the reference's formula.
	r := rand.New(rand.NewPCG(3, 3))
	v := make([]float32, 24)
	v64 := make([]float64, 24)
	for i := range v {
		v[i] = float32(2*r.Float64() - 1)
		v64[i] = float64(v[i])
	}
	newRopeTable(7, 9, 24, 10000).rotate(v, 6*9+8)
	refRope(v64, 6, 8, 10000)
	if e := maxErr(v, v64); e > 1e-6 {
		t.Fatalf("rotation of a random vector: error %.3g", e)
	}
}

// TestMergeOrder: a hand-built 4x6 grid whose rows hold y*100 + x: merged
// row (gy, gx) holds patches (2gy, 2gx), (2gy, 2gx+1), (2gy+1, 2gx),
// (2gy+1, 2gx+1), in that order.
func TestMergeOrder(t *testing.T) {
	const h, w = 4, 6
	x := make([]float32, h*w)
	for p := range x {
		x[p] = float32(p/w*100 + p%w)
	}
	got := mergeGroups(x, h, w, 1, 2, 2)
	want := []float32{
		0, 1, 100, 101, 2, 3, 102, 103, 4, 5, 104, 105,
		200, 201, 300, 301, 202, 203, 302, 303, 204, 205, 304, 305,
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("merged value %d is %v, want %v (all: %v)", i, got[i], want[i], got)
		}
	}
}

// TestBlocksMatchReference checks each block alone: patch embedding plus
// position table, one encoder block, and the merge plus projector.
func TestBlocksMatchReference(t *testing.T) {
	c := testConfig()
	tw, ts := loadTest(t, c, 2)
	r := ref{c: c, w: ts}
	im := randomPatches(c, 4, 8, 5)
	segs := []segment{{lo: 0, hi: 32, h: 4, w: 8}}

	x := tw.embedPatches([]Patches{im}, segs)
	want := r.patchEmbed(im)
	addInPlace(want, r.posTable(4, 8))
	if e := maxErr(x.Data, flat(want)); e > tol {
		t.Fatalf("patch embedding: error %.3g", e)
	}
	if err := tw.block(0, x, segs); err != nil {
		t.Fatal(err)
	}
	r.block(0, want, 4, 8)
	if e := maxErr(x.Data, flat(want)); e > tol {
		t.Fatalf("block 0: error %.3g", e)
	}
	merged := mergeGroups(x.Data, 4, 8, c.Hidden, 2, 2)
	if e := maxErr(tw.project(merged, 8), flat(r.project(r.merge(want, 4, 8)))); e > tol {
		t.Fatalf("merge and projector: error %.3g", e)
	}
}

// TestAttentionStaysInImage: two images packed together attend each only to
// itself; the reference run over their joint rows (one image of 2x(h+h))
// differs, so the test sees a leak.
func TestAttentionStaysInImage(t *testing.T) {
	c := testConfig()
	tw, _ := loadTest(t, c, 3)
	r := ref{c: c}
	rng := rand.New(rand.NewPCG(9, 9))
	rows := 2*4 + 2*2
	qkv := make([]float32, rows*3*c.QKV)
	for i := range qkv {
		qkv[i] = float32(2*rng.Float64() - 1)
	}
	rowsOf := func(lo, hi int) [][]float64 {
		var out [][]float64
		for t := lo; t < hi; t++ {
			out = append(out, toF64(qkv[t*3*c.QKV:(t+1)*3*c.QKV]))
		}
		return out
	}
	want := append(r.attention(rowsOf(0, 8), 2, 4), r.attention(rowsOf(8, 12), 2, 2)...)
	leaky := r.attention(rowsOf(0, 12), 6, 2)
	in := append([]float32(nil), qkv...)
	got, err := tw.attention(in, []segment{{0, 8, 2, 4}, {8, 12, 2, 2}})
	if err != nil {
		t.Fatal(err)
	}
	if e := maxErr(got, flat(want)); e > tol {
		t.Fatalf("packed attention: error %.3g", e)
	}
	if e := maxErr(got, flat(leaky)); e < 1e-2 {
		t.Fatalf("attention across the two images gives the same output (%.3g): the test cannot see a leak", e)
	}
}

func toF64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// TestExpNonPositive: the softmax's exp is within 1e-8 of math.Exp over the
// range it takes (x <= 0), and 0 below e^-708.
func TestExpNonPositive(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for i := 0; i < 200000; i++ {
		x := -r.Float64() * 40
		if i%10 == 0 {
			x = -r.Float64() * 708
		}
		if got, want := expNonPositive(x), math.Exp(x); math.Abs(got-want) > 1e-8*want {
			t.Fatalf("exp(%v) = %v, want %v", x, got, want)
		}
	}
	for _, x := range []float64{0, -1e-300, -0.5 * math.Ln2, 0.5 * math.Ln2 * -1.0000001} {
		if got, want := expNonPositive(x), math.Exp(x); math.Abs(got-want) > 1e-8*want {
			t.Fatalf("exp(%v) = %v, want %v", x, got, want)
		}
	}
	if expNonPositive(-800) != 0 || expNonPositive(math.Inf(-1)) != 0 {
		t.Fatal("no underflow to 0")
	}
}

// TestPortableFunctions: the portable sine, cosine, erf and rotary
// frequencies agree with Go's math package far below fp32's precision.
func TestPortableFunctions(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	for i := 0; i < 100000; i++ {
		a := r.Float64()*1200 - 100
		if i < 600 {
			a = float64(i) * 0.999 // the grid's angles: integers times frequencies up to 1
		}
		s, c := sinCos(a)
		if math.Abs(s-math.Sin(a)) > 1e-14 || math.Abs(c-math.Cos(a)) > 1e-14 {
			t.Fatalf("sinCos(%v) = %v, %v; math: %v, %v", a, s, c, math.Sin(a), math.Cos(a))
		}
		z := r.Float64()*16 - 8
		if got, want := erf(z), math.Erf(z); math.Abs(got-want) > 1e-14 {
			t.Fatalf("erf(%v) = %v, math.Erf %v", z, got, want)
		}
	}
	for j := 0; j < 32; j++ {
		e := float64(float32(4*j) / 128)
		if got, want := ropeFreq(10000, e), math.Pow(10000, -e); math.Abs(got-want) > 1e-14*want {
			t.Fatalf("frequency %d: %v, want %v", j, got, want)
		}
	}
}
