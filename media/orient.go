package media

// orient applies an EXIF orientation (1..8) the way Pillow's
// ImageOps.exif_transpose does: 2 mirror, 3 rotate 180, 4 flip, 5 transpose,
// 6 rotate 90 clockwise, 7 transverse, 8 rotate 90 counter-clockwise.
func orient(r *raster, o int) *raster {
	if o <= 1 || o > 8 {
		return r
	}
	w, h := r.w, r.h
	ow, oh := w, h
	if o >= 5 {
		ow, oh = h, w
	}
	// src gives the source pixel for output pixel (x, y).
	src := func(x, y int) int {
		switch o {
		case 2:
			return y*w + (w - 1 - x)
		case 3:
			return (h-1-y)*w + (w - 1 - x)
		case 4:
			return (h-1-y)*w + x
		case 5:
			return x*w + y
		case 6:
			return (h-1-x)*w + y
		case 7:
			return (h-1-x)*w + (w - 1 - y)
		default: // 8
			return x*w + (w - 1 - y)
		}
	}
	out := *r
	out.w, out.h = ow, oh
	if r.pix32 != nil {
		out.pix32 = make([]int32, len(r.pix32))
		for y := range oh {
			for x := range ow {
				out.pix32[y*ow+x] = r.pix32[src(x, y)]
			}
		}
		return &out
	}
	ch := r.channels()
	out.pix = make([]uint8, len(r.pix))
	for y := range oh {
		for x := range ow {
			s := src(x, y) * ch
			copy(out.pix[(y*ow+x)*ch:(y*ow+x+1)*ch], r.pix[s:s+ch])
		}
	}
	return &out
}
