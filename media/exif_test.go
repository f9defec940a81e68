package media

import (
	"bytes"
	"encoding/binary"
	"image"
	"image/color"
	"image/jpeg"
	"slices"
	"testing"
)

// The stored image is 3 wide, 2 high, pixels numbered
//
//	1 2 3
//	4 5 6
//
// and each orientation's upright picture is written out by hand from the
// EXIF definition (where the stored row 0 and column 0 belong).
func TestOrientAllEight(t *testing.T) {
	want := map[int]struct {
		w, h int
		pix  []uint8
	}{
		1: {3, 2, []uint8{1, 2, 3, 4, 5, 6}},
		2: {3, 2, []uint8{3, 2, 1, 6, 5, 4}},
		3: {3, 2, []uint8{6, 5, 4, 3, 2, 1}},
		4: {3, 2, []uint8{4, 5, 6, 1, 2, 3}},
		5: {2, 3, []uint8{1, 4, 2, 5, 3, 6}},
		6: {2, 3, []uint8{4, 1, 5, 2, 6, 3}},
		7: {2, 3, []uint8{6, 3, 5, 2, 4, 1}},
		8: {2, 3, []uint8{3, 6, 2, 5, 1, 4}},
	}
	for o, w := range want {
		r := &raster{kind: kindGray, w: 3, h: 2, pix: []uint8{1, 2, 3, 4, 5, 6}, key: -1}
		got := orient(r, o)
		if got.w != w.w || got.h != w.h || !slices.Equal(got.pix, w.pix) {
			t.Errorf("orientation %d: %dx%d %v, want %dx%d %v", o, got.w, got.h, got.pix, w.w, w.h, w.pix)
		}
		// Three channels move together.
		rgb := &raster{kind: kindRGB, w: 3, h: 2, key: -1}
		for _, v := range r.pix {
			rgb.pix = append(rgb.pix, v, v+10, v+20)
		}
		got = orient(rgb, o)
		for i, v := range w.pix {
			if !slices.Equal(got.pix[3*i:3*i+3], []uint8{v, v + 10, v + 20}) {
				t.Errorf("orientation %d, RGB pixel %d = %v", o, i, got.pix[3*i:3*i+3])
			}
		}
	}
}

// exifAPP1 builds an APP1 segment whose IFD0 holds the given entries
// (tag, type, count, value), in byte order bo.
func exifAPP1(bo interface {
	binary.ByteOrder
	binary.AppendByteOrder
}, entries [][4]uint32) []byte {
	tiff := []byte("II*\x00\x08\x00\x00\x00")
	if bo.String() == "BigEndian" {
		tiff = []byte("MM\x00*\x00\x00\x00\x08")
	}
	tiff = bo.AppendUint16(tiff, uint16(len(entries)))
	for _, e := range entries {
		tiff = bo.AppendUint16(tiff, uint16(e[0]))
		tiff = bo.AppendUint16(tiff, uint16(e[1]))
		tiff = bo.AppendUint32(tiff, e[2])
		if e[1] == 3 {
			tiff = bo.AppendUint16(tiff, uint16(e[3]))
			tiff = append(tiff, 0, 0)
		} else {
			tiff = bo.AppendUint32(tiff, e[3])
		}
	}
	tiff = append(tiff, 0, 0, 0, 0) // no next IFD
	seg := append([]byte("Exif\x00\x00"), tiff...)
	return append([]byte{0xff, 0xe1, byte((len(seg) + 2) >> 8), byte(len(seg) + 2)}, seg...)
}

// withAPP1 puts seg right after a JPEG's SOI marker.
func withAPP1(jpg, seg []byte) []byte {
	return slices.Concat(jpg[:2], seg, jpg[2:])
}

func TestJPEGOrientationParsing(t *testing.T) {
	var b bytes.Buffer
	if err := jpeg.Encode(&b, image.NewGray(image.Rect(0, 0, 8, 8)), nil); err != nil {
		t.Fatal(err)
	}
	jpg := b.Bytes()
	le, be := binary.LittleEndian, binary.BigEndian
	cases := []struct {
		name string
		data []byte
		want int
	}{
		{"none", jpg, 1},
		{"little-endian 6", withAPP1(jpg, exifAPP1(le, [][4]uint32{{0x010f, 2, 4, 0}, {0x0112, 3, 1, 6}})), 6},
		{"big-endian 3", withAPP1(jpg, exifAPP1(be, [][4]uint32{{0x0112, 3, 1, 3}})), 3},
		{"LONG 8", withAPP1(jpg, exifAPP1(be, [][4]uint32{{0x0112, 4, 1, 8}})), 8},
		{"out of range 9", withAPP1(jpg, exifAPP1(le, [][4]uint32{{0x0112, 3, 1, 9}})), 1},
		{"zero count", withAPP1(jpg, exifAPP1(le, [][4]uint32{{0x0112, 3, 0, 6}})), 1},
	}
	// An IFD claiming 65,535 entries in a short segment, and one whose offset
	// points past the end: both read as no orientation.
	huge := exifAPP1(le, [][4]uint32{{0x0112, 3, 1, 6}})
	binary.LittleEndian.PutUint16(huge[4+6+8:], 0xffff)
	huge[4+6+8+2] = 0x11 // the one real entry is no longer 0x0112
	cases = append(cases, struct {
		name string
		data []byte
		want int
	}{"huge count", withAPP1(jpg, huge), 1})
	far := exifAPP1(le, [][4]uint32{{0x0112, 3, 1, 6}})
	binary.LittleEndian.PutUint32(far[4+6+4:], 0x7fffffff)
	cases = append(cases, struct {
		name string
		data []byte
		want int
	}{"offset past end", withAPP1(jpg, far), 1})
	for _, c := range cases {
		if got := jpegOrientation(c.data); got != c.want {
			t.Errorf("%s: orientation %d, want %d", c.name, got, c.want)
		}
	}
}

func TestDecodeAppliesOrientation(t *testing.T) {
	// 32 wide, 16 high: left half black, right half white. Orientation 6
	// (rotate 90 clockwise) makes it 16 wide, 32 high, black on top.
	img := image.NewGray(image.Rect(0, 0, 32, 16))
	for y := range 16 {
		for x := 16; x < 32; x++ {
			img.SetGray(x, y, color.Gray{255})
		}
	}
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 100}); err != nil {
		t.Fatal(err)
	}
	data := withAPP1(b.Bytes(), exifAPP1(binary.BigEndian, [][4]uint32{{0x0112, 3, 1, 6}}))
	info, err := Probe(data, DefaultLimits())
	if err != nil || info.Width != 16 || info.Height != 32 || info.Format != "jpeg" {
		t.Fatalf("Probe = %+v, %v; want jpeg 16x32", info, err)
	}
	im, err := Decode(data, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if im.Width != 16 || im.Height != 32 {
		t.Fatalf("Decode size %dx%d, want 16x32", im.Width, im.Height)
	}
	// Lossy JPEG: compare away from the edge, within a few levels.
	if v := at(im, 0, 8, 4); v > norm(8) {
		t.Errorf("top of the rotated image = %v, want black", v)
	}
	if v := at(im, 0, 8, 28); v < norm(247) {
		t.Errorf("bottom of the rotated image = %v, want white", v)
	}
}
