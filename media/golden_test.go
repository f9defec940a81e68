package media

import (
	"encoding/hex"
	"image"
	"testing"
)

// goldenImage is a deterministic 7300x20 RGBA picture: downscaled by the
// side limit to 7168x19, so the hash covers the premultiplied bicubic
// resize, the chessboard and the patches.
func goldenImage() *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, 7300, 20))
	seed := uint32(7)
	for i := range img.Pix {
		seed = seed*1664525 + 1013904223
		img.Pix[i] = uint8(seed >> 24)
		if i%4 == 3 && (i/4)%7300 < 3000 {
			img.Pix[i] = 255 // the left part opaque, the rest of random alpha
		}
	}
	return img
}

// TestHashGolden pins Decode's output bit for bit: the hash recorded on
// amd64 must come out the same on every architecture (scripts/test.sh runs
// this under qemu for arm64, where the compiler could fuse multiply-adds),
// so that caches keyed by Hash agree across the prefill worker and the Macs.
// Both hashes are also what Pillow 9.4 gives: the sha256 of the patches
// testdata/pillow_ref.py writes for the same files (checked 2026-12-06).
func TestHashGolden(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"lossless webp 3x2", webpLossless3x2, "7ea8d5383737d713a8954df9d4f631ca6346ea844817e748df88d221df3050c5"},
		{"rgba png 7300x20", encodePNG(t, goldenImage()), "d0db4be6b3583f7f07cf0324e1240f41bb52ceeaabbd057939dc6870cb5f36c1"},
	}
	for _, c := range cases {
		im, err := Decode(c.data, DefaultLimits())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := hex.EncodeToString(im.Hash[:]); got != c.want {
			t.Errorf("%s: hash %s, want %s", c.name, got, c.want)
		}
	}
}
