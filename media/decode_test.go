package media

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/png"
	"math"
	"runtime"
	"strings"
	"testing"
)

func encodePNG(t testing.TB, img image.Image) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// at reads channel c of pixel (x, y) of the padded image from patches.
func at(im *Image, c, x, y int) float32 {
	p := (y/14)*im.GridW + x/14
	return im.Pixels[((p*3+c)*14+y%14)*14+x%14]
}

func norm(v float64) float32 { return float32((float32(v)/255 - 0.5) * 2) }

func TestDecodePadsBlackAndOrdersPatches(t *testing.T) {
	// 30x16: left half red, right half blue; kept, padded to 56x28 (4x2 patches).
	img := image.NewRGBA(image.Rect(0, 0, 30, 16))
	for y := range 16 {
		for x := range 30 {
			c := color.RGBA{255, 0, 0, 255}
			if x >= 15 {
				c = color.RGBA{0, 0, 255, 255}
			}
			img.SetRGBA(x, y, c)
		}
	}
	im, err := Decode(encodePNG(t, img), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if im.Width != 30 || im.Height != 16 || im.ResizedW != 30 || im.ResizedH != 16 || im.GridW != 4 || im.GridH != 2 || im.Rows() != 2 {
		t.Fatalf("got %dx%d resized %dx%d grid %dx%d rows %d", im.Width, im.Height, im.ResizedW, im.ResizedH, im.GridW, im.GridH, im.Rows())
	}
	if len(im.Pixels) != 8*3*14*14 {
		t.Fatalf("%d pixels, want %d", len(im.Pixels), 8*3*14*14)
	}
	// Patch 0 is red: (255/255-0.5)/0.5 = 1 on R, -1 elsewhere.
	if im.Pixels[0] != 1 || im.Pixels[14*14] != -1 || im.Pixels[2*14*14] != -1 {
		t.Errorf("patch 0 pixel 0 = %v %v %v, want 1 -1 -1", im.Pixels[0], im.Pixels[196], im.Pixels[392])
	}
	checks := []struct {
		x, y, c int
		want    float32
	}{
		{28, 0, 2, 1}, {29, 15, 2, 1}, {29, 15, 0, -1}, // blue, in patch 2
		{30, 0, 0, -1}, {30, 0, 1, -1}, {30, 0, 2, -1}, // right padding is black: -1
		{0, 16, 0, -1}, {55, 27, 2, -1}, // bottom padding
		{14, 13, 0, 1}, {0, 15, 0, 1}, // red in patches 1 and 4
	}
	for _, c := range checks {
		if got := at(im, c.c, c.x, c.y); got != c.want {
			t.Errorf("pixel (%d, %d) channel %d = %v, want %v", c.x, c.y, c.c, got, c.want)
		}
	}
	// Patch 4 (row 1, column 0) starts at y = 14: rows 14, 15 red, 16.. padding.
	p4 := im.Pixels[4*3*196:]
	if p4[0] != 1 || p4[2*14] != -1 {
		t.Errorf("patch 4 rows 0 and 2 = %v, %v; want 1, -1", p4[0], p4[28])
	}
}

func TestNormalisation(t *testing.T) {
	if normLUT[0] != -1 || normLUT[255] != 1 {
		t.Errorf("0 -> %v, 255 -> %v; want -1, 1", normLUT[0], normLUT[255])
	}
	for v := range 256 {
		want := (float64(v)/255 - 0.5) / 0.5
		if d := math.Abs(float64(normLUT[v]) - want); d > 1e-7 {
			t.Errorf("%d -> %v, want %v", v, normLUT[v], want)
		}
	}
}

func TestTransparencyOverChessboard(t *testing.T) {
	// 60x60 fully transparent: the image becomes the chessboard (s = 1).
	img := image.NewNRGBA(image.Rect(0, 0, 60, 60))
	im, err := Decode(encodePNG(t, img), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	gray := norm(180)
	for _, c := range []struct {
		x, y int
		want float32
	}{{0, 0, 1}, {7, 7, 1}, {8, 0, gray}, {0, 8, gray}, {8, 8, 1}, {16, 0, 1}, {59, 59, 1}, {56, 48, gray}, {60, 0, -1}} {
		for ch := range 3 {
			if got := at(im, ch, c.x, c.y); got != c.want {
				t.Errorf("(%d, %d) channel %d = %v, want %v", c.x, c.y, ch, got, c.want)
			}
		}
	}
	// Half transparent grey 40 (alpha 128): 128/255*40 + (1-128/255)*255 =
	// 147.08 over white, and *180 = 109.7 over grey, truncated.
	for i := range img.Pix {
		img.Pix[i] = []uint8{40, 40, 40, 128}[i%4]
	}
	im, err = Decode(encodePNG(t, img), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := at(im, 0, 0, 0), norm(147); got != want {
		t.Errorf("half alpha over white = %v, want %v (147)", got, want)
	}
	if got, want := at(im, 1, 8, 0), norm(109); got != want {
		t.Errorf("half alpha over grey = %v, want %v (109)", got, want)
	}
}

func TestPaletteGIF(t *testing.T) {
	pal := color.Palette{color.RGBA{10, 20, 30, 255}, color.RGBA{200, 100, 50, 255}, color.RGBA{0, 0, 0, 0}}
	img := image.NewPaletted(image.Rect(0, 0, 20, 10), pal)
	for i := range img.Pix {
		img.Pix[i] = uint8(i % 3)
	}
	var b bytes.Buffer
	if err := gif.Encode(&b, img, nil); err != nil {
		t.Fatal(err)
	}
	im, err := Decode(b.Bytes(), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if im.Width != 20 || im.Height != 10 || im.GridW != 2 || im.GridH != 2 {
		t.Fatalf("got %dx%d grid %dx%d", im.Width, im.Height, im.GridW, im.GridH)
	}
	// Pixel 0 is entry 0, pixel 1 entry 1, pixel 2 transparent over white.
	for x, want := range [][3]float64{{10, 20, 30}, {200, 100, 50}, {255, 255, 255}} {
		for c := range 3 {
			if got := at(im, c, x, 0); got != norm(want[c]) {
				t.Errorf("pixel %d channel %d = %v, want %v", x, c, got, norm(want[c]))
			}
		}
	}
}

func TestHashIsSHA256OfLittleEndianFloats(t *testing.T) {
	img := image.NewGray(image.Rect(0, 0, 5, 3))
	for i := range img.Pix {
		img.Pix[i] = uint8(i * 17)
	}
	im, err := Decode(encodePNG(t, img), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 4*len(im.Pixels))
	for i, v := range im.Pixels {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	if sha256.Sum256(raw) != im.Hash {
		t.Fatal("Hash is not the sha256 of Pixels as float32 little-endian")
	}
	img.Pix[7]++
	im2, err := Decode(encodePNG(t, img), DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if im2.Hash == im.Hash {
		t.Fatal("a changed pixel left the hash unchanged")
	}
}

// pngWithHeader is a PNG signature and an IHDR claiming w x h, with a valid
// CRC, and nothing else: what a decompression bomb's header looks like.
func pngWithHeader(w, h uint32) []byte {
	ihdr := make([]byte, 17)
	copy(ihdr, "IHDR")
	binary.BigEndian.PutUint32(ihdr[4:], w)
	binary.BigEndian.PutUint32(ihdr[8:], h)
	ihdr[12], ihdr[13] = 8, 6 // 8-bit RGBA
	b := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0d")
	b = append(b, ihdr...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(ihdr))
}

func TestHostileInputsAreRefusedClearly(t *testing.T) {
	good := encodePNG(t, image.NewRGBA(image.Rect(0, 0, 40, 30)))
	cases := []struct {
		name string
		data []byte
		lim  Limits
		want string
	}{
		{"bomb header", pngWithHeader(100000, 100000), DefaultLimits(), "100000x100000 = 10000000000 pixels, over the limit"},
		{"zero size", pngWithHeader(0, 10), DefaultLimits(), "png header"},
		{"garbage", []byte("hello, this is not an image"), DefaultLimits(), "unrecognised image format"},
		{"empty", nil, DefaultLimits(), "unrecognised image format"},
		{"truncated header", good[:20], DefaultLimits(), "truncated"},
		{"truncated data", good[:len(good)-20], DefaultLimits(), "decoding the png image (40x30)"},
		{"too many bytes", good, Limits{MaxBytes: 10, MaxPixels: 1 << 20}, "over the limit of 10 bytes"},
		{"too many pixels", good, Limits{MaxBytes: 1 << 20, MaxPixels: 1000}, "40x30 = 1200 pixels"},
		{"jpeg magic only", []byte{0xff, 0xd8, 0xff}, DefaultLimits(), "reading the jpeg header"},
		{"gif magic only", []byte("GIF89a"), DefaultLimits(), "reading the gif header"},
		{"webp magic only", []byte("RIFF\x04\x00\x00\x00WEBP"), DefaultLimits(), "reading the webp header"},
	}
	for _, c := range cases {
		_, err := Decode(c.data, c.lim)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

func TestZeroLimitsMeanDefaults(t *testing.T) {
	if _, err := Decode(encodePNG(t, image.NewGray(image.Rect(0, 0, 3, 3))), Limits{}); err != nil {
		t.Fatalf("zero Limits: %v", err)
	}
	if _, err := Probe(pngWithHeader(9000, 9000), Limits{MaxBytes: 1 << 20}); err == nil || !strings.Contains(err.Error(), "over the limit of 67108864 pixels") {
		t.Fatalf("zero MaxPixels: %v, want the default limit", err)
	}
}

func TestProbeOfBombAllocatesLittle(t *testing.T) {
	bomb := pngWithHeader(100000, 100000)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, err := Probe(bomb, DefaultLimits()); err == nil {
			t.Fatal("Probe accepted a 100000x100000 header")
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("10 probes of a bomb header allocated %d bytes", n)
	}
}
