package media

import "image"

// JPEG colour as libjpeg-turbo gives it to Pillow: subsampled chroma
// "fancy upsampled" (triangle interpolation, jdsample.c: h2v1, h1v2 and
// h2v2; plain repetition for chroma two samples wide or less and for other
// layouts) and YCbCr converted with libjpeg's 16-bit fixed-point tables
// (jdcolor.c). Go's image/jpeg repeats chroma samples instead, which moves
// pixels at colour edges by up to 160 levels. Only the IDCT still differs
// between the two decoders (a few levels).

const (
	yccScale = 16
	yccHalf  = 1 << (yccScale - 1)
)

func yccFix(x float64) int32 { return int32(x*(1<<yccScale) + 0.5) }

var yccCrR, yccCbB, yccCrG, yccCbG = func() (crR, cbB, crG, cbG [256]int32) {
	for i := range 256 {
		x := int32(i - 128)
		crR[i] = (yccFix(1.40200)*x + yccHalf) >> yccScale
		cbB[i] = (yccFix(1.77200)*x + yccHalf) >> yccScale
		crG[i] = -yccFix(0.71414) * x
		cbG[i] = -yccFix(0.34414)*x + yccHalf
	}
	return
}()

func clampByte(v int32) uint8 { return uint8(max(min(v, 255), 0)) }

// jpegYCbCrToRGB converts a decoded JPEG's planes to RGB as libjpeg-turbo does.
func jpegYCbCrToRGB(m *image.YCbCr) []uint8 {
	w, h := m.Rect.Dx(), m.Rect.Dy()
	cb := upsampleChroma(m, m.Cb)
	cr := upsampleChroma(m, m.Cr)
	out := make([]uint8, 3*w*h)
	for y := range h {
		yrow := m.Y[y*m.YStride : y*m.YStride+w]
		for x, yv := range yrow {
			i := y*w + x
			Y, b, r := int32(yv), cb[i], cr[i]
			out[3*i] = clampByte(Y + yccCrR[r])
			out[3*i+1] = clampByte(Y + (yccCbG[b]+yccCrG[r])>>yccScale)
			out[3*i+2] = clampByte(Y + yccCbB[b])
		}
	}
	return out
}

// upsampleChroma returns one chroma plane at full size (w*h).
func upsampleChroma(m *image.YCbCr, plane []uint8) []uint8 {
	w, h := m.Rect.Dx(), m.Rect.Dy()
	hs, vs := 1, 1 // horizontal and vertical subsampling factors
	switch m.SubsampleRatio {
	case image.YCbCrSubsampleRatio422:
		hs = 2
	case image.YCbCrSubsampleRatio420:
		hs, vs = 2, 2
	case image.YCbCrSubsampleRatio440:
		vs = 2
	case image.YCbCrSubsampleRatio411:
		hs = 4
	case image.YCbCrSubsampleRatio410:
		hs, vs = 4, 2
	}
	cw, ch := (w+hs-1)/hs, (h+vs-1)/vs
	row := func(r int) []uint8 {
		r = max(0, min(r, ch-1)) // the edges repeat their row, as libjpeg's context rows do
		return plane[r*m.CStride : r*m.CStride+cw]
	}
	out := make([]uint8, w*h)
	full := make([]uint8, cw*hs) // one upsampled row, possibly wider than w
	for y := range h {
		r := y / vs
		switch {
		case vs == 2 && (hs == 2 && cw > 2 || hs == 1):
			near := row(r - 1) // output rows 2r take the row above, 2r+1 the row below
			if y%2 == 1 {
				near = row(r + 1)
			}
			if hs == 2 {
				fancyH2V2(full, row(r), near)
			} else {
				fancyH1V2(full, row(r), near, y%2 == 1)
			}
		case vs == 1 && hs == 2 && cw > 2:
			fancyH2V1(full, row(r))
		default:
			for i, v := range row(r) {
				for k := range hs {
					full[i*hs+k] = v
				}
			}
		}
		copy(out[y*w:(y+1)*w], full[:w])
	}
	return out
}

// fancyH2V1 is jdsample.c's h2v1_fancy_upsample: 3/4 of the nearer sample
// plus 1/4 of the further one, rounding alternately down and up.
func fancyH2V1(out, in []uint8) {
	n := len(in)
	out[0] = in[0]
	out[1] = uint8((int(in[0])*3 + int(in[1]) + 2) >> 2)
	for i := 1; i < n-1; i++ {
		v := int(in[i]) * 3
		out[2*i] = uint8((v + int(in[i-1]) + 1) >> 2)
		out[2*i+1] = uint8((v + int(in[i+1]) + 2) >> 2)
	}
	out[2*n-2] = uint8((int(in[n-1])*3 + int(in[n-2]) + 1) >> 2)
	out[2*n-1] = in[n-1]
}

// fancyH1V2 is h1v2_fancy_upsample: 3/4 of this row plus 1/4 of the nearer
// neighbouring row, bias 1 above and 2 below.
func fancyH1V2(out, in, near []uint8, below bool) {
	bias := 1
	if below {
		bias = 2
	}
	for i := range in {
		out[i] = uint8((int(in[i])*3 + int(near[i]) + bias) >> 2)
	}
}

// fancyH2V2 is h2v2_fancy_upsample: a vertical 3:1 mix with the nearer
// neighbouring row, then the horizontal 3:1 mix, in sixteenths.
func fancyH2V2(out, in, near []uint8) {
	n := len(in)
	sum := func(i int) int { return int(in[i])*3 + int(near[i]) }
	this, next := sum(0), sum(1)
	out[0] = uint8((this*4 + 8) >> 4)
	out[1] = uint8((this*3 + next + 7) >> 4)
	last := this
	this = next
	for i := 1; i < n-1; i++ {
		next = sum(i + 1)
		out[2*i] = uint8((this*3 + last + 8) >> 4)
		out[2*i+1] = uint8((this*3 + next + 7) >> 4)
		last, this = this, next
	}
	out[2*n-2] = uint8((this*3 + last + 8) >> 4)
	out[2*n-1] = uint8((this*4 + 7) >> 4)
}
