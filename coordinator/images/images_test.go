package images

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/media"
	"github.com/tandem-inference/tandem/tokenizer"
)

// pngOf encodes a w x h image of a gradient.
func pngOf(t testing.TB, w, h int) []byte {
	t.Helper()
	im := image.NewNRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			im.Set(x, y, color.NRGBA{uint8(x), uint8(y), uint8(x + y), 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, im); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// pngHeader is a PNG that declares w x h pixels: a valid signature and
// IHDR, then an empty IDAT and IEND. Its header alone says it would take
// w*h*4 bytes decoded.
func pngHeader(w, h uint32) []byte {
	chunk := func(typ string, data []byte) []byte {
		var b bytes.Buffer
		_ = binary.Write(&b, binary.BigEndian, uint32(len(data)))
		b.WriteString(typ)
		b.Write(data)
		_ = binary.Write(&b, binary.BigEndian, crc32.ChecksumIEEE(append([]byte(typ), data...)))
		return b.Bytes()
	}
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 6 // 8-bit RGBA
	out := []byte("\x89PNG\r\n\x1a\n")
	out = append(out, chunk("IHDR", ihdr)...)
	out = append(out, chunk("IDAT", nil)...)
	return append(out, chunk("IEND", nil)...)
}

func TestSizeAndDecode(t *testing.T) {
	lim := DefaultLimits()
	data := pngOf(t, 100, 60)
	ci, err := lim.Decode(0, data)
	if err != nil {
		t.Fatal(err)
	}
	im, err := media.Decode(data, media.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	want := tokenizer.ChatImage{Width: 100, Height: 60, Rows: im.Rows()}
	if ci != want || want.Rows != 4*3 {
		t.Errorf("got %+v, want %+v with 12 rows (112x84 padded: 4x3 merged patches)", ci, want)
	}
}

func TestRefusals(t *testing.T) {
	good := pngOf(t, 40, 30)
	var jpg bytes.Buffer
	if err := jpeg.Encode(&jpg, image.NewGray(image.Rect(0, 0, 30, 20)), nil); err != nil {
		t.Fatal(err)
	}
	small := Limits{PerRequest: 2, Bytes: 4096, TotalBytes: 6000, Pixels: 10000}
	for _, tc := range []struct {
		name     string
		lim      Limits
		data     []byte
		decode   bool
		tooLarge bool
		want     string
	}{
		{"empty", small, nil, false, false, "is empty"},
		{"garbage", small, []byte("hello, world, not an image"), false, false, "unrecognised image format"},
		{"truncated header", small, good[:20], false, false, "png header: the file is truncated"},
		{"truncated body", small, good[:len(good)-30], true, false, "cannot be decoded"},
		{"too many bytes", small, bytes.Repeat([]byte{1}, 5000), false, true, "at most 4096 allowed (images.bytes)"},
		{"too many pixels", small, pngOf(t, 101, 100), false, true, "101x100 = 10100 pixels, at most 10000"},
		{"100k x 100k header", DefaultLimits(), pngHeader(100000, 100000), false, true, "100000x100000 = 10000000000 pixels"},
		{"bomb: 20k x 20k in a few bytes", DefaultLimits(), pngHeader(20000, 20000), true, true, "400000000 pixels"},
		{"jpeg", small, jpg.Bytes(), true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.decode {
				_, err = tc.lim.Decode(3, tc.data)
			} else {
				_, err = tc.lim.Size(3, tc.data)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ie *Error
			if !errors.As(err, &ie) || ie.Index != 3 || ie.TooLarge != tc.tooLarge || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want image #4 (too large %v) mentioning %q", err, tc.tooLarge, tc.want)
			}
		})
	}
	if _, err := small.Sizes([][]byte{good, good, good}, false); !IsTooLarge(err) || !strings.Contains(err.Error(), "3 images, at most 2") {
		t.Errorf("three images: %v", err)
	}
	big := bytes.Repeat([]byte{1}, 3500)
	if _, err := small.Sizes([][]byte{big, big}, false); !IsTooLarge(err) || !strings.Contains(err.Error(), "7000 bytes together, at most 6000") {
		t.Errorf("7000 bytes: %v", err)
	}
}

func TestDataURL(t *testing.T) {
	data := pngOf(t, 30, 30)
	b64 := base64.StdEncoding.EncodeToString(data)
	r := &Reader{Limits: Limits{Bytes: 4096}}
	got, err := r.Read(t.Context(), 0, "data:image/png;base64,"+b64)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if got, err := r.Read(t.Context(), 0, "DATA:Image/PNG;base64,"+strings.TrimRight(b64, "=")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("unpadded, upper case: %d bytes, %v", len(got), err)
	}
	for _, tc := range []struct {
		url, want string
		tooLarge  bool
	}{
		{"data:image/png;base64,%%%%", "base64 is malformed", false},
		{"data:image/png;base64", "no comma", false},
		{"data:image/svg+xml;base64," + b64, `media type is "image/svg+xml"`, false},
		{"data:text/plain;base64," + b64, `media type is "text/plain"`, false},
		{"data:image/png," + b64, "not base64", false},
		{"data:image/jpeg;base64," + b64, "says image/jpeg, but the data is a PNG image", false},
		{"data:image/png;base64," + strings.Repeat("AAAA", 2000), "at most 4096 allowed", true},
		{"http://example.com/a.png", "not fetched here", false},
		{"ftp://example.com/a.png", "neither a data: URL nor http(s)", false},
		{"", "is empty", false},
	} {
		_, err := r.Read(t.Context(), 1, tc.url)
		var ie *Error
		if !errors.As(err, &ie) || ie.Index != 1 || ie.TooLarge != tc.tooLarge || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.40s: error %v, want image #2 (too large %v) mentioning %q", tc.url, err, tc.tooLarge, tc.want)
		}
	}
}

func TestCheckPadRuns(t *testing.T) {
	const pad = 9
	imgs := []tokenizer.ChatImage{{Width: 28, Height: 28, Rows: 1}, {Width: 56, Height: 56, Rows: 4}}
	ok := []int32{1, pad, 2, pad, pad, pad, pad, 3}
	if err := CheckPadRuns(ok, pad, imgs); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ids  []int32
		want string
	}{
		{[]int32{1, pad, 2, pad, pad, pad, 3}, "image #2: has 4 feature rows, the prompt holds 3 pad tokens for it (at token 3)"},
		{[]int32{1, pad, 2}, "2 images are given for 1 runs"},
		{[]int32{1, pad, 2, pad, pad, pad, pad, 3, pad, 4}, "more runs of <|media_pad|> (id 9) than the 2 images"},
		{[]int32{1, pad, 2, pad, pad, pad, pad}, "image #2: its pad tokens end the prompt"},
	} {
		if err := CheckPadRuns(tc.ids, pad, imgs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.ids, err, tc.want)
		}
	}
}
