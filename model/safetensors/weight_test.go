package safetensors

import (
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/mxfp"
)

// t2 is a WriteTensor with zero data of the right size.
func t2(name string, dt DType, shape ...int64) WriteTensor {
	n, err := byteSize(dt, shape)
	if err != nil {
		panic(err)
	}
	return WriteTensor{Name: name, DType: dt, Shape: shape, Data: make([]byte, n)}
}

func openWritten(t *testing.T, tensors ...WriteTensor) *Checkpoint {
	t.Helper()
	dir := t.TempDir()
	if err := WriteFile(filepath.Join(dir, "model.safetensors"), tensors, nil); err != nil {
		t.Fatal(err)
	}
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestWeightFormats(t *testing.T) {
	c := openWritten(t,
		t2("e.w1.weight_packed", U8, 6, 32), t2("e.w1.weight_scale", U8, 6, 2), // MXFP4 [6, 64]
		t2("e.w2.weight_packed", U8, 4, 16), t2("e.w2.weight_scale", F8E8M0, 4, 1), // E8M0 dtype scales
		t2("q.weight", F8E4M3, 8, 96), t2("q.weight_scale", U8, 8, 3), // MXFP8
		t2("k.weight", F8E5M2, 2, 32), t2("k.weight_scale", U8, 2, 1),
		t2("o.weight", BF16, 5, 7), // dense
		t2("norm.weight", F32, 7),
		t2("conv.weight", F32, 12, 1, 4),
		t2("fp8plain.weight", F8E4M3, 3, 5), // an FP8 weight without block scales is dense
		t2("scalar.weight", F64),
		t2("zero.weight", BF16, 0, 5, 2),
	)
	cases := []struct {
		base       string
		format     Format
		rows, cols int
		data       string
		scale      string
	}{
		{"e.w1", MXFP4, 6, 64, "e.w1.weight_packed", "e.w1.weight_scale"},
		{"e.w2", MXFP4, 4, 32, "e.w2.weight_packed", "e.w2.weight_scale"},
		{"q", MXFP8, 8, 96, "q.weight", "q.weight_scale"},
		{"k", MXFP8, 2, 32, "k.weight", "k.weight_scale"},
		{"o", Dense, 5, 7, "o.weight", ""},
		{"norm", Dense, 1, 7, "norm.weight", ""},
		{"conv", Dense, 12, 4, "conv.weight", ""},
		{"fp8plain", Dense, 3, 5, "fp8plain.weight", ""},
		{"scalar", Dense, 1, 1, "scalar.weight", ""},
		{"zero", Dense, 0, 10, "zero.weight", ""},
	}
	for _, cs := range cases {
		w, err := c.Weight(cs.base)
		if err != nil {
			t.Errorf("%s: %v", cs.base, err)
			continue
		}
		if w.Name != cs.base || w.Format != cs.format || w.Rows != cs.rows || w.Cols != cs.cols || w.Data.Name != cs.data {
			t.Errorf("%s: %s %dx%d from %s; want %s %dx%d from %s", cs.base, w.Format, w.Rows, w.Cols, w.Data.Name, cs.format, cs.rows, cs.cols, cs.data)
		}
		if (w.Scale == nil) != (cs.scale == "") || w.Scale != nil && w.Scale.Name != cs.scale {
			t.Errorf("%s: scale %+v, want %q", cs.base, w.Scale, cs.scale)
		}
	}
}

func TestWeightInconsistent(t *testing.T) {
	c := openWritten(t,
		t2("noscale.weight_packed", U8, 4, 16),
		t2("wide.weight_packed", U8, 4, 16), t2("wide.weight_scale", U8, 4, 2), // scale for 64 columns, weight has 32
		t2("rows.weight_packed", U8, 4, 16), t2("rows.weight_scale", U8, 3, 1),
		t2("bf.weight_packed", BF16, 4, 16), t2("bf.weight_scale", U8, 4, 1),
		t2("flat.weight_packed", U8, 64), t2("flat.weight_scale", U8, 2),
		t2("odd.weight_packed", U8, 4, 8), t2("odd.weight_scale", U8, 4, 1), // 16 columns: not a block multiple
		t2("f32scale.weight_packed", U8, 4, 16), t2("f32scale.weight_scale", F32, 4, 1),
		t2("both.weight", BF16, 4, 32), t2("both.weight_packed", U8, 4, 16), t2("both.weight_scale", U8, 4, 1),
		t2("bfscaled.weight", BF16, 4, 32), t2("bfscaled.weight_scale", U8, 4, 1),
		t2("fp8chan.weight", F8E4M3, 4, 32), t2("fp8chan.weight_scale", F32, 4, 1), // per-channel FP8: not MX
		t2("fp8rank3.weight", F8E4M3, 2, 2, 32), t2("fp8rank3.weight_scale", U8, 2, 2),
		t2("int.weight", I32, 4, 4),
		t2("bool.weight", BOOL, 4),
		t2("scaleonly.weight_scale", U8, 4, 1),
	)
	cases := []struct {
		base, tensor string
		kind         error
		says         string
	}{
		{"noscale", "noscale.weight_packed", ErrMissing, "weight_scale"},
		{"wide", "wide.weight_scale", ErrFormat, "want [4, 1]"},
		{"rows", "rows.weight_scale", ErrFormat, "want [4, 1]"},
		{"bf", "bf.weight_packed", ErrFormat, "want U8"},
		{"flat", "flat.weight_packed", ErrFormat, "[64]"},
		{"odd", "odd.weight_scale", ErrFormat, "16 columns"},
		{"f32scale", "f32scale.weight_scale", ErrFormat, "F32"},
		{"both", "both.weight_packed", ErrFormat, "both"},
		{"bfscaled", "bfscaled.weight_scale", ErrFormat, "BF16"},
		{"fp8chan", "fp8chan.weight_scale", ErrFormat, "F32"},
		{"fp8rank3", "fp8rank3.weight", ErrFormat, "2-D"},
		{"int", "int.weight", ErrFormat, "I32"},
		{"bool", "bool.weight", ErrFormat, "BOOL"},
		{"scaleonly", "scaleonly", ErrMissing, "no scaleonly.weight"},
		{"absent", "absent", ErrMissing, "no absent.weight"},
	}
	for _, cs := range cases {
		_, err := c.Weight(cs.base)
		var e *Error
		if !errors.Is(err, cs.kind) || !errors.As(err, &e) || e.Tensor != cs.tensor || !strings.Contains(err.Error(), cs.says) {
			t.Errorf("%s: got %v; want %v naming %q and saying %q", cs.base, err, cs.kind, cs.tensor, cs.says)
		}
	}
}

// The fixture's packed tensors have no scales: they are not MXFP4 weights.
func TestWeightFixturePackedWithoutScale(t *testing.T) {
	c, err := Open(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Weight("language_model.model.layers.0.block_sparse_moe.experts.0.w1")
	if !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), "model-00001-of-00002.safetensors") {
		t.Errorf("got %v", err)
	}
}

// An expert written as MXFP4 and MXFP8 through the checkpoint gives the
// same products as the rows it was made from, read by view and by pread.
func TestWeightMXRowsThroughCheckpoint(t *testing.T) {
	const rows, cols = 4, 96
	rng := rand.New(rand.NewPCG(5, 6))
	src := make([]float32, rows*cols)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 0.05)
	}
	packed, scales4 := make([]byte, rows*cols/2), make([]byte, rows*cols/32)
	elems, scales8 := make([]byte, rows*cols), make([]byte, rows*cols/32)
	for r := range rows {
		mxfp.QuantizeMXFP4(packed[r*cols/2:(r+1)*cols/2], scales4[r*cols/32:(r+1)*cols/32], src[r*cols:(r+1)*cols])
		mxfp.QuantizeMXFP8(elems[r*cols:(r+1)*cols], scales8[r*cols/32:(r+1)*cols/32], src[r*cols:(r+1)*cols], false)
	}
	c := openWritten(t,
		WriteTensor{Name: "x.w1.weight_packed", DType: U8, Shape: []int64{rows, cols / 2}, Data: packed},
		WriteTensor{Name: "x.w1.weight_scale", DType: U8, Shape: []int64{rows, cols / 32}, Data: scales4},
		WriteTensor{Name: "x.w3.weight", DType: F8E4M3, Shape: []int64{rows, cols}, Data: elems},
		WriteTensor{Name: "x.w3.weight_scale", DType: U8, Shape: []int64{rows, cols / 32}, Data: scales8},
	)
	x := make([]float32, cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	w4, err := c.Weight("x.w1")
	if err != nil {
		t.Fatal(err)
	}
	w8, err := c.Weight("x.w3")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := c.Bytes(w4.Data.Name)
	s4 := make([]byte, w4.Scale.Size)
	if err := c.ReadTensor(w4.Scale.Name, s4); err != nil {
		t.Fatal(err)
	}
	e, _ := c.Bytes(w8.Data.Name)
	s8, _ := c.Bytes(w8.Scale.Name)
	for r := range w4.Rows {
		got := mxfp.DotMXFP4(p[r*w4.Cols/2:(r+1)*w4.Cols/2], s4[r*w4.Cols/32:(r+1)*w4.Cols/32], x)
		want := mxfp.DotMXFP4(packed[r*cols/2:(r+1)*cols/2], scales4[r*cols/32:(r+1)*cols/32], x)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Errorf("MXFP4 row %d: %v through the checkpoint, %v from memory", r, got, want)
		}
		got = mxfp.DotMXFP8(e[r*w8.Cols:(r+1)*w8.Cols], s8[r*w8.Cols/32:(r+1)*w8.Cols/32], x, w8.Data.DType == F8E5M2)
		want = mxfp.DotMXFP8(elems[r*cols:(r+1)*cols], scales8[r*cols/32:(r+1)*cols/32], x, false)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Errorf("MXFP8 row %d: %v through the checkpoint, %v from memory", r, got, want)
		}
	}
}
