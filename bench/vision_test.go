package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/media"
	"github.com/tandem-inference/tandem/model/vision"
)

// TestBenchVision runs bench vision on the tiny synthetic model and a
// 100x60 PNG: grid 8x6 patches (padded to 112x84), 12 feature rows of the
// tiny width 64; the files hold media's pixels and the tower's rows.
func TestBenchVision(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 0)
	tmp := t.TempDir()
	img := image.NewNRGBA(image.Rect(0, 0, 100, 60))
	for y := 0; y < 60; y++ {
		for x := 0; x < 100; x++ {
			img.Set(x, y, color.NRGBA{uint8(2 * x), uint8(4 * y), uint8(x ^ y), 255})
		}
	}
	var pngBytes bytes.Buffer
	if err := png.Encode(&pngBytes, img); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(tmp, "img.png")
	if err := os.WriteFile(file, pngBytes.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := parseVisionFlags([]string{"--model", dir, "--image", file,
		"--pixels-out", filepath.Join(tmp, "pix.f32"), "--out", filepath.Join(tmp, "feat.f32"), "--threads", "2"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	f.stdout = &out
	if err := f.validate(); err != nil {
		t.Fatal(err)
	}
	if err := runVision(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"100x60", "padded grid 8x6 patches (112x84 pixels)", "12 feature rows of width 64", "tower: 2 blocks"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	im, err := media.Decode(pngBytes.Bytes(), media.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if got := readFloats(t, filepath.Join(tmp, "pix.f32")); !equalFloats(got, im.Pixels) {
		t.Fatalf("pixels file: %d values, not media's %d", len(got), len(im.Pixels))
	}
	tw, err := vision.Load(context.Background(), cpu.New(1), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	want, err := tw.Features(context.Background(), []vision.Patches{{GridH: im.GridH, GridW: im.GridW, Pixels: im.Pixels}})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFloats(t, filepath.Join(tmp, "feat.f32")); len(got) != 12*64 || !equalFloats(got, want[0]) {
		t.Fatalf("features file: %d values, want the tower's %d", len(got), len(want[0]))
	}

	f.model = t.TempDir() // no checkpoint there
	if err := runVision(context.Background(), f); err == nil {
		t.Fatal("a folder without a model: no error")
	}
	if err := (visionConfig{model: dir}).validate(); err == nil || !strings.Contains(err.Error(), "--image") {
		t.Fatalf("no --image: %v", err)
	}
}

func readFloats(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func equalFloats(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
