package media

import (
	"fmt"
	"image"
	"image/color"
)

// kind is how Pillow would hold the decoded image (its "mode"), which decides
// how the released processor resizes it and whether it composites alpha.
type kind int

const (
	kindRGB     kind = iota // "RGB": bicubic on three channels
	kindRGBA                // "RGBA"/"LA": bicubic on premultiplied channels, then composited
	kindGray                // "L": bicubic on one channel; key >= 0 is a transparent value
	kindBilevel             // "1": nearest neighbour, 0 or 255
	kindIndexed             // "P": nearest neighbour on palette indices
	kindGray16              // "I" (16-bit greyscale): 32-bit bicubic, then clipped to 0..255
	kindCMYK                // "CMYK": bicubic on four channels, then converted
)

// raster is a decoded image in the layout its kind needs: pix holds
// channels() interleaved bytes a pixel, pix32 the 16-bit greyscale values.
type raster struct {
	kind  kind
	w, h  int
	pix   []uint8
	pix32 []int32
	pal   []color.NRGBA // kindIndexed
	key   int           // kindGray: the transparent value, or -1
}

func (r *raster) channels() int {
	switch r.kind {
	case kindRGB:
		return 3
	case kindRGBA, kindCMYK:
		return 4
	}
	return 1
}

// toRaster converts a decoded image to the raster Pillow's reading of the
// same file gives: same mode, same 8-bit values.
func toRaster(img image.Image, h header) (*raster, error) {
	b := img.Bounds()
	if g, ok := img.(*image.Paletted); ok && h.Format == "gif" {
		return gifRaster(g, h)
	}
	if b.Dx() != h.rawW || b.Dy() != h.rawH {
		return nil, fmt.Errorf("media: the %s decoder gave a %dx%d image for a %dx%d header", h.Format, b.Dx(), b.Dy(), h.rawW, h.rawH)
	}
	w, ht := b.Dx(), b.Dy()
	r := &raster{w: w, h: ht, key: -1}
	switch m := img.(type) {
	case *image.Paletted:
		r.kind, r.pix, r.pal = kindIndexed, copyPlane(m.Pix, m.Stride, w, ht, 1), nrgbaPalette(m.Palette)
	case *image.Gray:
		r.kind, r.pix = kindGray, copyPlane(m.Pix, m.Stride, w, ht, 1)
		if h.Format == "png" && h.png.bitDepth == 1 {
			r.kind = kindBilevel
		}
	case *image.Gray16:
		r.kind, r.pix32 = kindGray16, gray16(m.Pix, m.Stride, w, ht, 2, 0)
	case *image.NRGBA:
		r.kind, r.pix = kindRGBA, copyPlane(m.Pix, m.Stride, w, ht, 4)
		pngKeyed(r, h)
	case *image.NRGBA64:
		if h.png.colorType == 0 { // 16-bit greyscale with a tRNS key
			r.kind, r.pix32 = kindGray16, gray16(m.Pix, m.Stride, w, ht, 8, 0)
			break
		}
		r.kind, r.pix = kindRGBA, high8(m.Pix, m.Stride, w, ht, 4)
		pngKeyed(r, h)
	case *image.RGBA:
		r.kind, r.pix = kindRGB, dropAlpha(copyPlane(m.Pix, m.Stride, w, ht, 4))
	case *image.RGBA64:
		r.kind, r.pix = kindRGB, dropAlpha(high8(m.Pix, m.Stride, w, ht, 4))
	case *image.YCbCr:
		r.kind = kindRGB
		switch {
		case h.Format == "jpeg":
			r.pix = jpegYCbCrToRGB(m)
		case h.Format == "webp" && m.SubsampleRatio == image.YCbCrSubsampleRatio420:
			r.pix = webpYCbCrToRGB(m, nil, 0, 3)
		default:
			r.pix = ycbcrToRGB(m)
		}
	case *image.NYCbCrA:
		r.kind, r.pix = kindRGBA, nycbcraToRGBA(m)
		if h.Format == "webp" && m.SubsampleRatio == image.YCbCrSubsampleRatio420 {
			r.pix = webpYCbCrToRGB(&m.YCbCr, m.A, m.AStride, 4)
		}
	case *image.CMYK:
		r.kind, r.pix = kindCMYK, copyPlane(m.Pix, m.Stride, w, ht, 4)
	default:
		r.kind, r.pix = kindRGBA, genericNRGBA(img)
	}
	return r, nil
}

// pngKeyed fixes up a PNG whose tRNS chunk names a colour key: Go gives
// NRGBA, but Pillow keeps truecolour keyed images as "RGB" (the processor
// then ignores the key) and greyscale ones as "L" with a transparent value.
func pngKeyed(r *raster, h header) {
	if h.Format != "png" || !h.png.hasTRNS {
		return
	}
	switch h.png.colorType {
	case 2:
		r.kind, r.pix = kindRGB, dropAlpha(r.pix)
	case 0:
		gray := make([]uint8, r.w*r.h)
		for i := range gray {
			gray[i] = r.pix[4*i]
		}
		r.kind, r.pix, r.key = kindGray, gray, int(h.png.trnsGray)
	}
}

// gifRaster places the first frame on the logical screen as Pillow does
// (the rest filled with the transparent index, else 0) and reads a palette
// that is the identity grey ramp as greyscale ("L"), as Pillow does.
func gifRaster(m *image.Paletted, h header) (*raster, error) {
	screen := image.Rect(0, 0, h.rawW, h.rawH)
	trans := -1
	for i, c := range m.Palette {
		if _, _, _, a := c.RGBA(); a == 0 {
			trans = i
			break
		}
	}
	pix := make([]uint8, h.rawW*h.rawH)
	if trans >= 0 {
		for i := range pix {
			pix[i] = uint8(trans)
		}
	}
	area := m.Rect.Intersect(screen)
	for y := area.Min.Y; y < area.Max.Y; y++ {
		copy(pix[y*h.rawW+area.Min.X:y*h.rawW+area.Max.X], m.Pix[m.PixOffset(area.Min.X, y):m.PixOffset(area.Max.X, y)])
	}
	r := &raster{kind: kindIndexed, w: h.rawW, h: h.rawH, pix: pix, pal: nrgbaPalette(m.Palette), key: -1}
	if greyRamp(m.Palette) {
		r.kind, r.key, r.pal = kindGray, trans, nil
	}
	return r, nil
}

// greyRamp reports whether entry i is (i, i, i) for every entry; the
// transparent entry, which Go's decoder blanks, is not checked.
func greyRamp(p color.Palette) bool {
	for i, c := range p {
		r, g, b, a := c.RGBA()
		if a == 0 {
			continue
		}
		if r>>8 != uint32(i) || g>>8 != uint32(i) || b>>8 != uint32(i) {
			return false
		}
	}
	return true
}

// nrgbaPalette pads the palette to 256 entries with opaque black, which is
// what Pillow reads for an index past the palette.
func nrgbaPalette(p color.Palette) []color.NRGBA {
	out := make([]color.NRGBA, 256)
	for i := range out {
		out[i] = color.NRGBA{A: 255}
		if i < len(p) {
			out[i] = color.NRGBAModel.Convert(p[i]).(color.NRGBA)
		}
	}
	return out
}

// copyPlane returns the w*h*ch bytes of a strided plane, the plane itself
// when it has no padding (the decoded image is Decode's own to reuse).
func copyPlane(src []uint8, stride, w, h, ch int) []uint8 {
	if stride == w*ch {
		return src[:w*h*ch]
	}
	out := make([]uint8, w*h*ch)
	for y := range h {
		copy(out[y*w*ch:(y+1)*w*ch], src[y*stride:y*stride+w*ch])
	}
	return out
}

// high8 keeps the high byte of 16-bit samples, as Pillow's ";16B" readers do.
func high8(src []uint8, stride, w, h, ch int) []uint8 {
	out := make([]uint8, w*h*ch)
	for y := range h {
		row := src[y*stride:]
		for i := range w * ch {
			out[y*w*ch+i] = row[2*i]
		}
	}
	return out
}

// gray16 reads the first 16-bit big-endian sample of each pixel.
func gray16(src []uint8, stride, w, h, bytesPerPixel, off int) []int32 {
	out := make([]int32, w*h)
	for y := range h {
		row := src[y*stride:]
		for x := range w {
			p := x*bytesPerPixel + off
			out[y*w+x] = int32(row[p])<<8 | int32(row[p+1])
		}
	}
	return out
}

func dropAlpha(rgba []uint8) []uint8 {
	n := len(rgba) / 4
	out := make([]uint8, 3*n)
	for i := range n {
		copy(out[3*i:3*i+3], rgba[4*i:4*i+3])
	}
	return out
}

func ycbcrToRGB(m *image.YCbCr) []uint8 {
	b := m.Rect
	out := make([]uint8, 0, 3*b.Dx()*b.Dy())
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			yi, ci := m.YOffset(x, y), m.COffset(x, y)
			r, g, bb := color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci])
			out = append(out, r, g, bb)
		}
	}
	return out
}

func nycbcraToRGBA(m *image.NYCbCrA) []uint8 {
	b := m.Rect
	out := make([]uint8, 0, 4*b.Dx()*b.Dy())
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			yi, ci := m.YOffset(x, y), m.COffset(x, y)
			r, g, bb := color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci])
			out = append(out, r, g, bb, m.A[m.AOffset(x, y)])
		}
	}
	return out
}

func genericNRGBA(img image.Image) []uint8 {
	b := img.Bounds()
	out := make([]uint8, 0, 4*b.Dx()*b.Dy())
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.NRGBAModel.Convert(img.At(x, y)).(color.NRGBA)
			out = append(out, c.R, c.G, c.B, c.A)
		}
	}
	return out
}
