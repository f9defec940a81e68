package media

// The released processor (K3's preprocessor_config.json) fills transparency
// after resizing, over a chessboard of 8-pixel squares: white (255) on the
// top-left square and every square diagonal to it, grey (180) on the others.
const (
	chessSquare = 8
	chessWhite  = 255
	chessGray   = 180
)

func chessboard(x, y int) float32 {
	if (x/chessSquare+y/chessSquare)%2 == 1 {
		return chessGray
	}
	return chessWhite
}

// composite puts straight-alpha RGBA over the chessboard exactly as the
// released numpy code does: alpha = A/255 in float32, alpha*rgb +
// (1-alpha)*board in float32, then truncated to uint8. The float32()
// conversions keep each product rounded on its own, as numpy does.
func composite(rgba []uint8, w, h int) []uint8 {
	out := make([]uint8, 3*w*h)
	for y := range h {
		for x := range w {
			i := y*w + x
			a := float32(rgba[4*i+3]) / 255
			bg := float32(float32(1-a) * chessboard(x, y))
			for c := range 3 {
				v := float32(a*float32(rgba[4*i+c])) + bg
				out[3*i+c] = uint8(min(v, 255))
			}
		}
	}
	return out
}

// premultiply and unpremultiply are Pillow's RGBA <-> RGBa conversions, which
// Image.resize wraps around resampling an image with alpha. Both work in
// place.
func premultiply(rgba []uint8) []uint8 {
	for i := 0; i < len(rgba); i += 4 {
		a := uint32(rgba[i+3])
		for c := range 3 {
			t := uint32(rgba[i+c])*a + 128
			rgba[i+c] = uint8(((t >> 8) + t) >> 8)
		}
	}
	return rgba
}

func unpremultiply(rgba []uint8) {
	for i := 0; i < len(rgba); i += 4 {
		a := uint32(rgba[i+3])
		if a == 0 || a == 255 {
			continue
		}
		for c := range 3 {
			rgba[i+c] = uint8(min(255*uint32(rgba[i+c])/a, 255))
		}
	}
}

// cmykToRGB is Pillow's cmyk2rgb: each channel (255-K) less C (or M, Y)
// scaled by (255-K)/255, rounded as MULDIV255.
func cmykToRGB(cmyk []uint8) []uint8 {
	n := len(cmyk) / 4
	out := make([]uint8, 3*n)
	for i := range n {
		nk := int32(255 - int32(cmyk[4*i+3]))
		for c := range 3 {
			t := int32(cmyk[4*i+c])*nk + 128
			v := nk - (((t >> 8) + t) >> 8)
			out[3*i+c] = uint8(max(min(v, 255), 0))
		}
	}
	return out
}
