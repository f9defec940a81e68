package media

import "math"

// Bicubic resampling exactly as Pillow 9.4's Resample.c does it for
// Image.resize(size, BICUBIC): a separable convolution (horizontal pass,
// then vertical), a = -0.5, the filter's support widened by the downscale
// factor (antialiasing), each output's weights normalised to sum 1, and for
// 8-bit images weights in fixed point with 22 fractional bits, the sum
// rounded and clipped to 0..255 after each pass. float64() conversions around
// products stop the compiler fusing them into FMAs (arm64 does), which would
// change roundings Pillow's C code does not make.

const precisionBits = 32 - 8 - 2

func bicubic(x float64) float64 {
	const a = -0.5
	if x < 0 {
		x = -x
	}
	if x < 1 {
		return float64(float64(float64((a+2)*x)-(a+3))*x*x) + 1
	}
	if x < 2 {
		return float64(float64(float64(float64((x-5)*x)+8)*x)-4) * a
	}
	return 0
}

// coeffs are one pass's weights: for output i, inputs bounds[2i] ..
// bounds[2i]+bounds[2i+1]-1 with weights k[i*ksize:].
type coeffs struct {
	ksize  int
	bounds []int
	k      []float64
}

// precompute is Pillow's precompute_coeffs for a box of the whole input.
func precompute(inSize, outSize int) coeffs {
	scale := float64(inSize) / float64(outSize)
	filterscale := max(scale, 1)
	support := 2 * filterscale // bicubic support 2, widened when downscaling
	ksize := int(math.Ceil(support))*2 + 1
	c := coeffs{ksize: ksize, bounds: make([]int, 2*outSize), k: make([]float64, outSize*ksize)}
	ss := 1 / filterscale
	for xx := range outSize {
		center := float64(float64(xx)+0.5) * scale
		xmin := max(int(center-support+0.5), 0)
		xmax := min(int(center+support+0.5), inSize) - xmin
		k := c.k[xx*ksize : (xx+1)*ksize]
		ww := 0.0
		for x := range xmax {
			w := bicubic(float64(float64(x+xmin)-center+0.5) * ss)
			k[x] = w
			ww += w
		}
		if ww != 0 {
			for x := range xmax {
				k[x] /= ww
			}
		}
		c.bounds[2*xx], c.bounds[2*xx+1] = xmin, xmax
	}
	return c
}

// fixed is normalize_coeffs_8bpc: weights rounded half away from zero to
// 22 fractional bits.
func (c coeffs) fixed() []int32 {
	out := make([]int32, len(c.k))
	for i, v := range c.k {
		p := float64(v * (1 << precisionBits))
		if v < 0 {
			out[i] = int32(-0.5 + p)
		} else {
			out[i] = int32(0.5 + p)
		}
	}
	return out
}

func clip8(ss int32) uint8 {
	v := ss >> precisionBits
	if v < 0 {
		return 0
	}
	if v > 255 {
		return 255
	}
	return uint8(v)
}

// resample8 resizes interleaved 8-bit pixels of ch channels from w x h to
// rw x rh as Pillow's ImagingResampleInner does: the horizontal pass only
// over the rows the vertical pass reads, and a pass skipped when its size is
// unchanged.
func resample8(pix []uint8, ch, w, h, rw, rh int) []uint8 {
	if w == rw && h == rh {
		return pix
	}
	vert := precompute(h, rh)
	if w != rw {
		first := vert.bounds[0]
		last := vert.bounds[2*rh-2] + vert.bounds[2*rh-1]
		pix = horizontal8(pix[first*w*ch:last*w*ch], ch, w, rw, last-first)
		for i := range rh {
			vert.bounds[2*i] -= first
		}
	}
	if h != rh {
		pix = vertical8(pix, ch, rw, rh, vert)
	}
	return pix
}

func horizontal8(pix []uint8, ch, w, rw, rows int) []uint8 {
	c := precompute(w, rw)
	k := c.fixed()
	out := make([]uint8, rw*rows*ch)
	for y := range rows {
		in := pix[y*w*ch : (y+1)*w*ch]
		o := out[y*rw*ch : (y+1)*rw*ch]
		for xx := range rw {
			xmin, n := c.bounds[2*xx], c.bounds[2*xx+1]
			kk := k[xx*c.ksize : xx*c.ksize+n]
			for b := range ch {
				ss := int32(1 << (precisionBits - 1))
				for x, wt := range kk {
					ss += int32(in[(xmin+x)*ch+b]) * wt
				}
				o[xx*ch+b] = clip8(ss)
			}
		}
	}
	return out
}

func vertical8(pix []uint8, ch, w, rh int, c coeffs) []uint8 {
	k := c.fixed()
	out := make([]uint8, w*rh*ch)
	stride := w * ch
	for yy := range rh {
		ymin, n := c.bounds[2*yy], c.bounds[2*yy+1]
		kk := k[yy*c.ksize : yy*c.ksize+n]
		o := out[yy*stride : (yy+1)*stride]
		for i := range stride {
			ss := int32(1 << (precisionBits - 1))
			for y, wt := range kk {
				ss += int32(pix[(ymin+y)*stride+i]) * wt
			}
			o[i] = clip8(ss)
		}
	}
	return out
}

// resample32 is the same convolution for Pillow's 32-bit integer mode ("I",
// where 16-bit greyscale PNGs land): double weights, each pass's sum rounded
// half away from zero to an int32.
func resample32(pix []int32, w, h, rw, rh int) []int32 {
	if w == rw && h == rh {
		return pix
	}
	vert := precompute(h, rh)
	if w != rw {
		first := vert.bounds[0]
		last := vert.bounds[2*rh-2] + vert.bounds[2*rh-1]
		c := precompute(w, rw)
		rows := last - first
		out := make([]int32, rw*rows)
		for y := range rows {
			in := pix[(first+y)*w : (first+y+1)*w]
			for xx := range rw {
				xmin, n := c.bounds[2*xx], c.bounds[2*xx+1]
				ss := 0.0
				for x, wt := range c.k[xx*c.ksize : xx*c.ksize+n] {
					ss += float64(float64(in[xmin+x]) * wt)
				}
				out[y*rw+xx] = roundUp32(ss)
			}
		}
		pix = out
		for i := range rh {
			vert.bounds[2*i] -= first
		}
	}
	if h != rh {
		out := make([]int32, rw*rh)
		for yy := range rh {
			ymin, n := vert.bounds[2*yy], vert.bounds[2*yy+1]
			kk := vert.k[yy*vert.ksize : yy*vert.ksize+n]
			for x := range rw {
				ss := 0.0
				for y, wt := range kk {
					ss += float64(float64(pix[(ymin+y)*rw+x]) * wt)
				}
				out[yy*rw+x] = roundUp32(ss)
			}
		}
		pix = out
	}
	return pix
}

// roundUp32 is Pillow's ROUND_UP: half away from zero, then truncation.
func roundUp32(f float64) int32 {
	if f >= 0 {
		return int32(f + 0.5)
	}
	return int32(f - 0.5)
}

// nearest is Pillow's nearest-neighbour resize (ImagingScaleAffine), used for
// palette and bilevel images: the source coordinate starts at half a step and
// is accumulated step by step, then truncated.
func nearest(pix []uint8, w, h, rw, rh int) []uint8 {
	if w == rw && h == rh {
		return pix
	}
	xs := nearestIndex(w, rw)
	ys := nearestIndex(h, rh)
	out := make([]uint8, rw*rh)
	for y, sy := range ys {
		row := pix[sy*w : (sy+1)*w]
		for x, sx := range xs {
			out[y*rw+x] = row[sx]
		}
	}
	return out
}

func nearestIndex(in, out int) []int {
	step := float64(in) / float64(out)
	idx := make([]int, out)
	pos := 0 + step*0.5
	for i := range idx {
		idx[i] = min(max(int(pos), 0), in-1)
		pos += step
	}
	return idx
}
