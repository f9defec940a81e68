package media

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"slices"
	"strings"
	"testing"
)

// webpLossless3x2 is a 3x2 lossless WebP written by Pillow 9.4 (libwebp
// 1.2.4): red, green, blue / (10,20,30), transparent, (1,2,3) at alpha 128.
var webpLossless3x2, _ = hex.DecodeString("5249464646000000574542505650384c390000002f024000102f40906db30de1feaed72093b609fde65ff00804288a19feef44206963f3f1e40f00ffc9a3ba6d4141da062cee9e9245f43fae1500")

// webpEXIF6 and pngEXIF6 are 3x2 images in (9, 99, 199) written by Pillow 9.4
// with EXIF orientation 6 in WebP's EXIF chunk and PNG's eXIf chunk.
var (
	webpEXIF6, _ = hex.DecodeString("524946465200000057454250565038580a000000080000000200000100005650384c110000002f0240000007d0b126f4b8ff8188e87f0000455849461a0000004d4d002a00000008000101120003000000010006000000000000")
	pngEXIF6, _  = hex.DecodeString("89504e470d0a1a0a0000000d49484452000000030000000208020000001216f14d0000001a655849664d4d002a00000008000101120003000000010006000000000000d6674b690000001549444154789c63e44c3ecec0c0c0c0c0c0c400030015140137d150c0000000000049454e44ae426082")
)

func TestOrientationInPNGAndWebP(t *testing.T) {
	for name, data := range map[string][]byte{"webp": webpEXIF6, "png": pngEXIF6} {
		im, err := Decode(data, DefaultLimits())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if im.Width != 2 || im.Height != 3 {
			t.Errorf("%s: %dx%d, want 2x3 (orientation 6 applied)", name, im.Width, im.Height)
		}
		if got := at(im, 2, 1, 2); got != norm(199) {
			t.Errorf("%s: blue at (1, 2) = %v, want %v", name, got, norm(199))
		}
	}
}

func TestWebPLossless(t *testing.T) {
	im, err := Decode(webpLossless3x2, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if im.Width != 3 || im.Height != 2 || im.GridW != 2 || im.GridH != 2 {
		t.Fatalf("got %dx%d grid %dx%d", im.Width, im.Height, im.GridW, im.GridH)
	}
	// Opaque pixels exact; (1,1) transparent over the white top-left square;
	// (2,1) at alpha 128 over white: 128/255*c + 127/255*255, truncated.
	want := [][2][3]float64{
		{{255, 0, 0}, {0, 255, 0}},
		{{10, 20, 30}, {255, 255, 255}},
	}
	for y := range 2 {
		for x := range 2 {
			for c := range 3 {
				if got := at(im, c, x, y); got != norm(want[y][x][c]) {
					t.Errorf("(%d, %d) channel %d = %v, want %v", x, y, c, got, norm(want[y][x][c]))
				}
			}
		}
	}
	for c, v := range []float64{127, 128, 128} {
		if got := at(im, c, 2, 1); got != norm(v) {
			t.Errorf("half-transparent pixel channel %d = %v, want %v", c, got, norm(v))
		}
	}
}

func fuzzSeeds(t testing.TB) [][]byte {
	rgba := image.NewNRGBA(image.Rect(0, 0, 9, 5))
	for i := range rgba.Pix {
		rgba.Pix[i] = uint8(i * 37)
	}
	var j, g bytes.Buffer
	if err := jpeg.Encode(&j, rgba, nil); err != nil {
		t.Fatal(err)
	}
	pal := image.NewPaletted(image.Rect(0, 0, 4, 3), color.Palette{color.Black, color.White, color.Transparent})
	if err := gif.Encode(&g, pal, nil); err != nil {
		t.Fatal(err)
	}
	exif := withAPP1(j.Bytes(), exifAPP1(binary.LittleEndian, [][4]uint32{{0x0112, 3, 1, 6}}))
	return [][]byte{encodePNG(t, rgba), j.Bytes(), exif, g.Bytes(), webpLossless3x2, webpEXIF6, pngEXIF6, pngWithHeader(100000, 100000), pngWithHeader(3, 0)}
}

// FuzzDecode feeds mutated images to Decode: it must return an image that
// keeps the invariants or an error, never panic, hang or allocate by a
// header's claim (the limits here keep every accepted image small).
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	lim := Limits{MaxBytes: 1 << 16, MaxPixels: 1 << 14}
	f.Fuzz(func(t *testing.T, data []byte) {
		info, perr := Probe(data, lim)
		im, err := Decode(data, lim)
		if err != nil {
			return
		}
		if perr != nil {
			t.Fatalf("Probe refused (%v) what Decode accepted", perr)
		}
		if im.Width != info.Width || im.Height != info.Height {
			t.Fatalf("Decode %dx%d, Probe %dx%d", im.Width, im.Height, info.Width, info.Height)
		}
		rw, rh, gw, gh, err := Plan(im.Width, im.Height)
		if err != nil || rw != im.ResizedW || rh != im.ResizedH || gw != im.GridW || gh != im.GridH {
			t.Fatalf("Plan disagrees with Decode: %d %d %d %d %v", rw, rh, gw, gh, err)
		}
		if len(im.Pixels) != gw*gh*3*14*14 {
			t.Fatalf("%d pixels for a %dx%d grid", len(im.Pixels), gw, gh)
		}
		for _, v := range im.Pixels {
			if !(v >= -1 && v <= 1) {
				t.Fatalf("pixel value %v outside [-1, 1]", v)
			}
		}
	})
}

// A VP8X WebP's decoder allocates by the frame's size, not the canvas's that
// DecodeConfig reports: a frame larger than its canvas must be refused by
// Probe, before decoding.
func TestWebPFrameMustMatchCanvas(t *testing.T) {
	if string(webpEXIF6[12:16]) != "VP8X" || string(webpEXIF6[30:34]) != "VP8L" {
		t.Fatal("the seed is not a VP8X file with a VP8L frame at offset 30")
	}
	bomb := slices.Clone(webpEXIF6)
	binary.LittleEndian.PutUint32(bomb[39:], 0x3fff|0x3fff<<14) // frame 16384x16384
	small := slices.Clone(webpEXIF6)
	small[24] = 1 // canvas 2x2, frame 3x2
	anim := slices.Clone(webpEXIF6)
	anim[20] |= 1 << 1
	for name, c := range map[string]struct {
		data []byte
		want string
	}{
		"frame larger than canvas": {bomb, "canvas is 3x2 but its frame is 16384x16384"},
		"canvas smaller":           {small, "canvas is 2x2 but its frame is 3x2"},
		"animated":                 {anim, "animated WebP is not supported"},
	} {
		if _, err := Probe(c.data, DefaultLimits()); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Probe error %v, want %q", name, err, c.want)
		}
	}
}
