package vision

import "github.com/tandem-inference/tandem/kernels"

// Patch embedding: the released 14x14x3 convolution with stride 14 and no
// bias is, per patch, a dot product of each output channel's kernel with the
// patch's 588 values; the checkpoint's [out, 3, 14, 14] kernel flattened in
// (c, y, x) order is a matrix [out, 588] and the patches (in the same
// order, row-major over the grid) its input rows.

// embedPatches returns x [N, Hidden] = pixels [N, 588] · PatchEmbedᵀ plus
// each image's position table.
func (t *Tower) embedPatches(imgs []Patches, segs []segment) *kernels.Tensor {
	n := segs[len(segs)-1].hi
	pv := t.cfg.PatchValues()
	pix := make([]float32, 0, n*pv)
	for _, im := range imgs {
		pix = append(pix, im.Pixels...)
	}
	in := upload(t.be, pix, n, pv)
	defer t.be.Free(in)
	x := t.be.NewTensor(n, t.cfg.Hidden)
	t.be.MatMul(x, in, t.w.PatchEmbed)

	pos := make([]float32, 0, n*t.cfg.Hidden)
	for _, im := range imgs {
		pos = append(pos, positionTable(t.cfg, t.w.PosEmb, im.GridH, im.GridW)...)
	}
	p := upload(t.be, pos, n, t.cfg.Hidden)
	defer t.be.Free(p)
	t.be.Add(x, x, p)
	return x
}

// positionTable is the learned [PosH, PosW, D] table for a grid of h x w
// patches, [h*w, D] row-major: the table itself at exactly its own size,
// else resampled bilinearly. The released code adds a time term only for
// video (more than one frame); an image has none.
func positionTable(c *Config, table []float32, h, w int) []float32 {
	if h == c.PosH && w == c.PosW {
		return table
	}
	return resampleBilinear(table, c.PosH, c.PosW, c.Hidden, h, w)
}

// resampleBilinear resizes a [inH, inW, d] grid of vectors to [outH, outW,
// d] as PyTorch's bilinear interpolation does with align_corners false and
// no antialiasing: output cell i samples the input at (i + 0.5)·in/out −
// 0.5 (half-pixel centres), clamped below at 0, between its two
// neighbours; the last row and column repeat at the upper edge. The index
// arithmetic is fp32, as PyTorch's; the blend is fp64.
func resampleBilinear(table []float32, inH, inW, d, outH, outW int) []float32 {
	ys, xs := bilinearTaps(inH, outH), bilinearTaps(inW, outW)
	out := make([]float32, outH*outW*d)
	for oy, ty := range ys {
		for ox, tx := range xs {
			dst := out[(oy*outW+ox)*d : (oy*outW+ox+1)*d]
			a := table[(ty.i0*inW+tx.i0)*d:]
			b := table[(ty.i0*inW+tx.i1)*d:]
			c := table[(ty.i1*inW+tx.i0)*d:]
			e := table[(ty.i1*inW+tx.i1)*d:]
			for k := range dst {
				// Products rounded before their sums: the same bits on arm64.
				top := float64(tx.l0*float64(a[k])) + float64(tx.l1*float64(b[k]))
				bot := float64(tx.l0*float64(c[k])) + float64(tx.l1*float64(e[k]))
				dst[k] = float32(float64(ty.l0*top) + float64(ty.l1*bot))
			}
		}
	}
	return out
}

// tap is one output index's two input neighbours and their weights.
type tap struct {
	i0, i1 int
	l0, l1 float64
}

// bilinearTaps computes the taps of every output index along one axis.
func bilinearTaps(in, out int) []tap {
	scale := float32(in) / float32(out)
	taps := make([]tap, out)
	for o := range taps {
		src := float32(scale*(float32(o)+0.5)) - 0.5
		if src < 0 {
			src = 0
		}
		i0 := int(src)
		i1 := i0
		if i0 < in-1 {
			i1++
		}
		l1 := float64(src - float32(i0))
		taps[o] = tap{i0: i0, i1: i1, l0: 1 - l1, l1: l1}
	}
	return taps
}
