package media

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
)

// normLUT maps a byte to (v/255 - 0.5)/0.5 computed as the released numpy
// code does in float32 (v/255 rounded to float32, then the exact -0.5 and x2).
var normLUT = func() (lut [256]float32) {
	for v := range lut {
		x := float32(v) / 255
		lut[v] = (x - 0.5) * 2
	}
	return lut
}()

// patchify pads rgb (w x h, 3 bytes a pixel) with black (0, which normalises
// to -1) on the right and bottom to gridW x gridH patches and writes the
// normalised patches in row-major patch order, each [3][14][14].
func patchify(rgb []uint8, w, h, gridW, gridH int) []float32 {
	const p = PatchSize
	out := make([]float32, gridW*gridH*3*p*p)
	for py := range gridH {
		for px := range gridW {
			patch := out[(py*gridW+px)*3*p*p:][:3*p*p]
			for dy := range p {
				y := py*p + dy
				for dx := range p {
					x := px*p + dx
					var r, g, b uint8
					if x < w && y < h {
						i := 3 * (y*w + x)
						r, g, b = rgb[i], rgb[i+1], rgb[i+2]
					}
					patch[0*p*p+dy*p+dx] = normLUT[r]
					patch[1*p*p+dy*p+dx] = normLUT[g]
					patch[2*p*p+dy*p+dx] = normLUT[b]
				}
			}
		}
	}
	return out
}

// hashPixels is the sha256 of the pixels as float32 little-endian, the
// image's identity for caches.
func hashPixels(pix []float32) [32]byte {
	h := sha256.New()
	buf := make([]byte, 4*4096)
	for len(pix) > 0 {
		n := min(len(pix), 4096)
		for i, v := range pix[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
		h.Write(buf[:4*n])
		pix = pix[n:]
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}
