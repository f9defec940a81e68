package media

import (
	"bytes"
	"image"
	"image/jpeg"
	"image/png"
	"testing"
	"time"
)

// benchImage is a deterministic photo-like picture: smooth gradients with a
// pseudo-random texture, so the encoders cannot shrink it to nothing.
func benchImage(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	seed := uint32(1)
	for y := range h {
		for x := range w {
			seed = seed*1664525 + 1013904223
			n := uint8(seed >> 27)
			i := img.PixOffset(x, y)
			img.Pix[i] = uint8(x*255/w) + n
			img.Pix[i+1] = uint8(y*255/h) + n
			img.Pix[i+2] = uint8((x+y)*255/(w+h)) - n
			img.Pix[i+3] = 255
		}
	}
	return img
}

// BenchmarkDecode times Decode (decode + preprocess + hash) against the
// standard library's decode of the same file, the two interleaved in each
// iteration so that a shared machine's load falls on both alike: the
// Decode/stdlib ratio is what preprocessing costs on top of decoding.
func BenchmarkDecode(b *testing.B) {
	var pngData, jpegData bytes.Buffer
	if err := png.Encode(&pngData, benchImage(1024, 768)); err != nil {
		b.Fatal(err)
	}
	if err := jpeg.Encode(&jpegData, benchImage(4000, 3000), &jpeg.Options{Quality: 90}); err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name   string
		data   []byte
		stdlib func([]byte) error
	}{
		{"png-1024x768", pngData.Bytes(), func(d []byte) error { _, err := png.Decode(bytes.NewReader(d)); return err }},
		{"jpeg-4000x3000", jpegData.Bytes(), func(d []byte) error { _, err := jpeg.Decode(bytes.NewReader(d)); return err }},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var std, med time.Duration
			n := 0
			for b.Loop() {
				t0 := time.Now()
				if err := c.stdlib(c.data); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if _, err := Decode(c.data, DefaultLimits()); err != nil {
					b.Fatal(err)
				}
				std, med, n = std+t1.Sub(t0), med+time.Since(t1), n+1
			}
			b.ReportMetric(float64(std.Milliseconds())/float64(n), "ms/stdlib")
			b.ReportMetric(float64(med.Milliseconds())/float64(n), "ms/Decode")
			b.ReportMetric(float64(med)/float64(std), "Decode/stdlib")
		})
	}
}
