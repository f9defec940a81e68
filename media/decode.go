package media

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"

	"golang.org/x/image/webp"
)

// Image is one preprocessed image, ready for the vision tower.
type Image struct {
	Width, Height      int       // original size, after EXIF orientation (the marker's WxH)
	ResizedW, ResizedH int       // after the scale rule
	GridW, GridH       int       // 14-pixel patches of the padded image (both even)
	Pixels             []float32 // [GridH*GridW, 3, 14, 14]: normalised patches, row-major patch order
	Hash               [32]byte  // sha256 of Pixels as float32 little-endian
}

// Rows is the number of feature rows the tower gives the image: one per 2x2
// group of patches.
func (im *Image) Rows() int { return (im.GridH / MergeSize) * (im.GridW / MergeSize) }

// Decode checks data with Probe, decodes the first frame, applies the EXIF
// orientation and preprocesses it as K3's released processor does.
func Decode(data []byte, lim Limits) (*Image, error) {
	h, err := probe(data, lim)
	if err != nil {
		return nil, err
	}
	img, err := decodeFormat(h.Format, data)
	if err != nil {
		return nil, fmt.Errorf("media: decoding the %s image (%dx%d): %w", h.Format, h.rawW, h.rawH, eofError(err))
	}
	r, err := toRaster(img, h)
	if err != nil {
		return nil, err
	}
	r = orient(r, h.orientation)
	return preprocess(r)
}

func decodeFormat(format string, data []byte) (image.Image, error) {
	rd := bytes.NewReader(data)
	switch format {
	case "png":
		return png.Decode(rd)
	case "jpeg":
		return jpeg.Decode(rd)
	case "gif":
		return gif.Decode(rd) // the first frame only
	case "webp":
		return webp.Decode(rd)
	}
	return nil, fmt.Errorf("unsupported format %q", format)
}

// preprocess runs the released processor's steps on an oriented raster:
// the scale rule, the resize in the image's own mode, compositing over the
// chessboard, then padding, normalisation and patches.
func preprocess(r *raster) (*Image, error) {
	rw, rh, gw, gh, err := Plan(r.w, r.h)
	if err != nil {
		return nil, err
	}
	rgb := resizeToRGB(r, rw, rh)
	im := &Image{Width: r.w, Height: r.h, ResizedW: rw, ResizedH: rh, GridW: gw, GridH: gh}
	im.Pixels = patchify(rgb, rw, rh, gw, gh)
	im.Hash = hashPixels(im.Pixels)
	return im, nil
}

// resizeToRGB resizes r to rw x rh as Pillow's Image.resize(BICUBIC) treats
// its mode, then converts to RGB as the processor does (compositing alpha).
// It may reuse and overwrite r's pixels.
func resizeToRGB(r *raster, rw, rh int) []uint8 {
	same := r.w == rw && r.h == rh
	switch r.kind {
	case kindRGB:
		return resample8(r.pix, 3, r.w, r.h, rw, rh)
	case kindRGBA:
		pix := r.pix
		if !same { // Pillow resizes RGBA premultiplied ("RGBa")
			pix = resample8(premultiply(pix), 4, r.w, r.h, rw, rh)
			unpremultiply(pix)
		}
		return composite(pix, rw, rh)
	case kindCMYK:
		return cmykToRGB(resample8(r.pix, 4, r.w, r.h, rw, rh))
	case kindGray:
		g := resample8(r.pix, 1, r.w, r.h, rw, rh)
		if r.key >= 0 {
			return composite(keyAlpha(g, r.key), rw, rh)
		}
		return grayToRGB(g)
	case kindBilevel:
		return grayToRGB(nearest(r.pix, r.w, r.h, rw, rh))
	case kindIndexed:
		return paletteToRGB(nearest(r.pix, r.w, r.h, rw, rh), r.pal, rw, rh)
	case kindGray16:
		v := resample32(r.pix32, r.w, r.h, rw, rh)
		g := make([]uint8, len(v))
		for i, x := range v { // Pillow's "I" to "RGB" clips
			g[i] = uint8(max(min(x, 255), 0))
		}
		return grayToRGB(g)
	}
	panic("media: unknown raster kind")
}

func grayToRGB(g []uint8) []uint8 {
	out := make([]uint8, 3*len(g))
	for i, v := range g {
		out[3*i], out[3*i+1], out[3*i+2] = v, v, v
	}
	return out
}

// keyAlpha is Pillow's "L" to "RGBA" with a transparency value: that value
// becomes fully transparent, every other one opaque.
func keyAlpha(g []uint8, key int) []uint8 {
	out := make([]uint8, 4*len(g))
	for i, v := range g {
		out[4*i], out[4*i+1], out[4*i+2], out[4*i+3] = v, v, v, 255
		if int(v) == key {
			out[4*i+3] = 0
		}
	}
	return out
}

// paletteToRGB expands palette indices; with any transparent entry the image
// is composited ("P" with transparency goes through "RGBA"), else converted.
func paletteToRGB(idx []uint8, pal []color.NRGBA, w, h int) []uint8 {
	alpha := false
	for _, c := range pal {
		alpha = alpha || c.A != 255
	}
	if !alpha {
		out := make([]uint8, 3*len(idx))
		for i, v := range idx {
			c := pal[v]
			out[3*i], out[3*i+1], out[3*i+2] = c.R, c.G, c.B
		}
		return out
	}
	rgba := make([]uint8, 4*len(idx))
	for i, v := range idx {
		c := pal[v]
		rgba[4*i], rgba[4*i+1], rgba[4*i+2], rgba[4*i+3] = c.R, c.G, c.B, c.A
	}
	return composite(rgba, w, h)
}
