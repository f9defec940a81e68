package media

import "image"

// Lossy WebP colour as libwebp 1.2.4 gives it to Pillow: its "fancy"
// chroma upsampler (dsp/upsampling.c; rows taken in pairs that share the
// chroma rows above and below them, io_dec.c) and its fixed-point YUV to RGB
// (dsp/yuv.h). The VP8 planes themselves are decoded exactly by Go.

// webpYUVToRGB converts one pixel as VP8YuvToRgb does.
func webpYUVToRGB(y, u, v int) (r, g, b uint8) {
	mulHi := func(v, c int) int { return v * c >> 8 }
	clip := func(v int) uint8 {
		if v&^(256<<6-1) == 0 {
			return uint8(v >> 6)
		}
		if v < 0 {
			return 0
		}
		return 255
	}
	yy := mulHi(y, 19077)
	return clip(yy + mulHi(v, 26149) - 14234),
		clip(yy - mulHi(u, 6419) - mulHi(v, 13320) + 8708),
		clip(yy + mulHi(u, 33050) - 17685)
}

// webpChromaRow upsamples one output row's chroma from chroma rows top and
// cur: bottom says the row is the lower of its pair (nearer cur).
func webpChromaRow(dst, top, cur []uint8, bottom bool) {
	w := len(dst)
	tl, l := int(top[0]), int(cur[0])
	edge := func(tl, l int) uint8 { // the first and (even width) last pixel
		if bottom {
			return uint8((3*l + tl + 2) >> 2)
		}
		return uint8((3*tl + l + 2) >> 2)
	}
	dst[0] = edge(tl, l)
	for x := 1; x <= (w-1)>>1; x++ {
		t, c := int(top[x]), int(cur[x])
		avg := tl + t + l + c + 8
		d12 := (avg + 2*(t+l)) >> 3
		d03 := (avg + 2*(tl+c)) >> 3
		if bottom {
			dst[2*x-1], dst[2*x] = uint8((d03+l)>>1), uint8((d12+c)>>1)
		} else {
			dst[2*x-1], dst[2*x] = uint8((d12+tl)>>1), uint8((d03+t)>>1)
		}
		tl, l = t, c
	}
	if w%2 == 0 {
		dst[w-1] = edge(tl, l)
	}
}

// webpYCbCrToRGB converts a lossy WebP's 4:2:0 planes to interleaved bytes,
// ch 3 (RGB) or 4 (RGBA with alpha from a).
func webpYCbCrToRGB(m *image.YCbCr, a []uint8, aStride, ch int) []uint8 {
	w, h := m.Rect.Dx(), m.Rect.Dy()
	cw := (w + 1) / 2
	crow := func(p []uint8, r int) []uint8 { return p[r*m.CStride : r*m.CStride+cw] }
	u, v := make([]uint8, w), make([]uint8, w)
	out := make([]uint8, ch*w*h)
	for y := range h {
		t, c, bottom := 0, 0, false
		switch {
		case y == 0:
		case y%2 == 1: // the upper row of a pair, or the last row of an even height
			t, c = (y-1)/2, min((y+1)/2, (h-1)/2)
			if y == h-1 {
				c = t
			}
		default:
			t, c, bottom = y/2-1, y/2, true
		}
		webpChromaRow(u, crow(m.Cb, t), crow(m.Cb, c), bottom)
		webpChromaRow(v, crow(m.Cr, t), crow(m.Cr, c), bottom)
		yrow := m.Y[y*m.YStride:]
		for x := range w {
			o := out[ch*(y*w+x):]
			o[0], o[1], o[2] = webpYUVToRGB(int(yrow[x]), int(u[x]), int(v[x]))
			if ch == 4 {
				o[3] = a[y*aStride+x]
			}
		}
	}
	return out
}
