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
// normalised patches in row-major patch order, each [3][14][14]. It works a
// pixel row at a time: each channel's normalised row is built once, then cut
// into the 14-value rows of its patches.
func patchify(rgb []uint8, w, h, gridW, gridH int) []float32 {
	const p = PatchSize
	padW := gridW * p
	out := make([]float32, gridW*gridH*3*p*p)
	var rows [3][]float32
	for c := range rows {
		rows[c] = make([]float32, padW)
	}
	for y := range gridH * p {
		for c := range rows {
			row := rows[c]
			if y >= h {
				row = row[:0]
			} else {
				src := rgb[3*y*w : 3*(y+1)*w]
				for x := range w {
					row[x] = normLUT[src[3*x+c]]
				}
				row = row[:w]
			}
			for x := len(row); x < padW; x++ {
				rows[c][x] = normLUT[0]
			}
		}
		py, dy := y/p, y%p
		for px := range gridW {
			base := ((py*gridW+px)*3)*p*p + dy*p
			for c := range rows {
				// Array assignment, not copy: a 14-value move inline, no memmove call.
				*(*[p]float32)(out[base+c*p*p:]) = [p]float32(rows[c][px*p:])
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
