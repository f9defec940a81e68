package media

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
)

// pillowCase is one entry of the reference script's cases.json.
type pillowCase struct {
	Width, Height      int
	ResizedW, ResizedH int
	GridW, GridH       int
	F32, Dec           bool
}

func (c *pillowCase) UnmarshalJSON(b []byte) error {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	n := func(k string) int { v, _ := m[k].(float64); return int(v) }
	c.Width, c.Height, c.ResizedW, c.ResizedH = n("width"), n("height"), n("resized_w"), n("resized_h")
	c.GridW, c.GridH = n("grid_w"), n("grid_h")
	c.F32, _ = m["f32"].(bool)
	c.Dec, _ = m["dec"].(bool)
	return nil
}

// byteDiff is the largest absolute difference and how many bytes differ.
func byteDiff(a, b []uint8) (maxd, n int) {
	for i := range a {
		d := int(a[i]) - int(b[i])
		if d != 0 {
			n++
			maxd = max(maxd, d, -d)
		}
	}
	return maxd, n
}

// decoderBound is, for JPEG, the largest pixel difference allowed between
// Go's decoder (with libjpeg-turbo's chroma upsampling and colour tables,
// jpegcolor.go) and libjpeg-turbo as Pillow links it: their inverse DCTs
// round differently, which moved samples by up to 3 levels on the reference
// images (2026-12-06). Preprocessing itself is checked exactly from Pillow's
// decoded pixels. Everything else, lossy WebP included, must match exactly.
var decoderBound = map[string]int{
	"jpeg_o6_333x517.jpg":  4,
	"jpeg_o3_7300x200.jpg": 4,
	"jpeg_420_641x479.jpg": 4,
	"jpeg_422_301x199.jpg": 4,
	"jpeg_cmyk_120x90.jpg": 4,
}

// TestAgainstPillow preprocesses images of odd sizes, downscaled and only
// padded, with and without alpha, in every mode the formats give, and
// compares with Pillow 9.4 running the released processor's steps
// (testdata/pillow_ref.py). Pillow rounds to bytes, so the bound is 1 (1/255;
// 2/255 after normalisation); every image but JPEG in fact matches exactly.
func TestAgainstPillow(t *testing.T) {
	if testing.Short() {
		t.Skip("the Pillow comparison takes about a minute; skipped under -short")
	}
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skipf("%s not found: the comparison with Pillow is skipped (Debian: apt-get install python3-pil=9.4.0-1.1+deb12u1)", py)
	}
	if out, err := exec.Command(py, "-c", "import PIL, sys; sys.exit(PIL.__version__ != '9.4.0')").CombinedOutput(); err != nil {
		t.Skipf("Pillow 9.4.0 is not importable by %s (%v %s): the comparison is skipped (Debian: apt-get install python3-pil=9.4.0-1.1+deb12u1)", py, err, out)
	}
	dir := t.TempDir()
	if out, err := exec.Command(py, "testdata/pillow_ref.py", dir).CombinedOutput(); err != nil {
		t.Fatalf("pillow_ref.py: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases map[string]pillowCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(cases))
	for name := range cases {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) { comparePillow(t, dir, name, cases[name]) })
	}
}

func comparePillow(t *testing.T, dir, name string, c pillowCase) {
	path := filepath.Join(dir, name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lim := Limits{MaxBytes: 64 << 20, MaxPixels: 64 << 20}
	r := decodedRaster(t, data, lim)
	rw, rh, gw, gh, err := Plan(r.w, r.h)
	if err != nil {
		t.Fatal(err)
	}
	if r.w != c.Width || r.h != c.Height || rw != c.ResizedW || rh != c.ResizedH || gw != c.GridW || gh != c.GridH {
		t.Fatalf("got %dx%d -> %dx%d grid %dx%d; Pillow %dx%d -> %dx%d grid %dx%d", r.w, r.h, rw, rh, gw, gh,
			c.Width, c.Height, c.ResizedW, c.ResizedH, c.GridW, c.GridH)
	}
	want := mustRead(t, path+".rgb")
	got := resizeToRGB(r, c.ResizedW, c.ResizedH)
	maxd, n := byteDiff(got, want)
	t.Logf("%dx%d -> %dx%d: %d of %d bytes differ from Pillow, by at most %d", c.Width, c.Height, c.ResizedW, c.ResizedH, n, len(want), maxd)
	if c.Dec {
		// Pillow's decoded pixels through Go's preprocessing must match exactly.
		dec := mustRead(t, path+".dec")
		dmax, dn := byteDiff(rgbOf(r), dec)
		t.Logf("decoders: %d of %d bytes differ, by at most %d", dn, len(dec), dmax)
		fromPillow := &raster{kind: kindRGB, w: c.Width, h: c.Height, pix: dec, key: -1}
		pmax, pn := byteDiff(resizeToRGB(fromPillow, c.ResizedW, c.ResizedH), want)
		if pmax > 1 {
			t.Errorf("from Pillow's decoded pixels: %d bytes differ, by at most %d (want at most 1)", pn, pmax)
		}
		if maxd > decoderBound[name] {
			t.Errorf("end to end: %d bytes differ by up to %d, over the decoder bound %d", n, maxd, decoderBound[name])
		}
	} else if maxd > 1 {
		t.Errorf("%d bytes differ from Pillow by up to %d (want at most 1)", n, maxd)
	}
	if c.F32 { // small images: the whole of Decode against Pillow's patches
		im, err := Decode(data, lim)
		if err != nil {
			t.Fatal(err)
		}
		f := mustRead(t, path+".f32")
		if len(f) != 4*len(im.Pixels) {
			t.Fatalf("Pillow wrote %d floats, Decode gave %d", len(f)/4, len(im.Pixels))
		}
		worst := 0.0
		for i, v := range im.Pixels {
			worst = max(worst, math.Abs(float64(v)-float64(math.Float32frombits(binary.LittleEndian.Uint32(f[4*i:])))))
		}
		if worst > 2.0/255+1e-6 {
			t.Errorf("normalised patches differ from Pillow's by up to %g (want at most 2/255)", worst)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodedRaster runs Decode's steps up to the resize.
func decodedRaster(t *testing.T, data []byte, lim Limits) *raster {
	t.Helper()
	h, err := probe(data, lim)
	if err != nil {
		t.Fatal(err)
	}
	img, err := decodeFormat(h.Format, data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := toRaster(img, h)
	if err != nil {
		t.Fatal(err)
	}
	return orient(r, h.orientation)
}

// rgbOf is an opaque raster's pixels as RGB, to compare decoders.
func rgbOf(r *raster) []uint8 {
	switch r.kind {
	case kindRGB:
		return r.pix
	case kindRGBA:
		return dropAlpha(r.pix)
	case kindCMYK:
		return cmykToRGB(r.pix)
	}
	return grayToRGB(r.pix)
}
