package vision

import (
	"context"
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
)

// Patches is one preprocessed image: its grid of GridH x GridW patches and
// their normalised pixels [GridH*GridW, 3, Patch, Patch], patches
// row-major (media.Image's fields of the same names).
type Patches struct {
	GridH, GridW int
	Pixels       []float32
}

// Rows is the number of feature rows the image gives.
func (c *Config) Rows(p Patches) int { return (p.GridH / c.MergeH) * (p.GridW / c.MergeW) }

// Tower is the vision tower and projector bound on a backend.
type Tower struct {
	cfg    *Config
	w      *Weights
	be     kernels.Backend
	closer func() error
}

// New binds w's matrices on be.
func New(be kernels.Backend, cfg *Config, w *Weights) (*Tower, error) {
	t := &Tower{cfg: cfg, w: w, be: be}
	for i, m := range w.Matrices() {
		if err := be.Bind(m); err != nil {
			for _, b := range w.Matrices()[:i] {
				be.Release(b)
			}
			return nil, err
		}
	}
	return t, nil
}

// Config returns the tower's configuration.
func (t *Tower) Config() *Config { return t.cfg }

// Close releases the bound weights and the checkpoint they were read
// from; the tower must not be used afterwards.
func (t *Tower) Close() error {
	for _, m := range t.w.Matrices() {
		t.be.Release(m)
	}
	if t.closer != nil {
		return t.closer()
	}
	return nil
}

// check refuses an image the tower cannot take: an empty or odd grid,
// a side beyond the rotary table, or pixels that do not fill the grid.
func (c *Config) check(i int, p Patches) error {
	if p.GridH <= 0 || p.GridW <= 0 || p.GridH%c.MergeH != 0 || p.GridW%c.MergeW != 0 {
		return fmt.Errorf("image %d: patch grid %dx%d is not a positive multiple of the %dx%d merge", i, p.GridH, p.GridW, c.MergeH, c.MergeW)
	}
	if p.GridH > c.RopeMax || p.GridW > c.RopeMax {
		return fmt.Errorf("image %d: patch grid %dx%d has a side over %d patches, the most the tower's rotary embedding covers", i, p.GridH, p.GridW, c.RopeMax)
	}
	if want := p.GridH * p.GridW * c.PatchValues(); len(p.Pixels) != want {
		return fmt.Errorf("image %d: %d pixel values for a %dx%d grid of %d-value patches, want %d", i, len(p.Pixels), p.GridH, p.GridW, c.PatchValues(), want)
	}
	return nil
}

// Features runs the tower and projector over the images, packed as one
// batch in which each image attends only to itself, and returns one
// [rows, TextHidden] slice per image, rows = (GridH/2)(GridW/2) row-major
// over the merged grid.
func (t *Tower) Features(ctx context.Context, imgs []Patches) (feats [][]float32, err error) {
	if len(imgs) == 0 {
		return nil, nil
	}
	c := t.cfg
	segs := make([]segment, len(imgs))
	lo := 0
	for i, im := range imgs {
		if err := c.check(i, im); err != nil {
			return nil, err
		}
		segs[i] = segment{lo: lo, hi: lo + im.GridH*im.GridW, h: im.GridH, w: im.GridW}
		lo = segs[i].hi
	}
	defer kernels.CatchDevice(&err)
	x := t.embedPatches(imgs, segs)
	defer t.be.Free(x)
	for i := range t.w.Blocks {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := t.block(i, x, segs); err != nil {
			return nil, fmt.Errorf("vision block %d: %w", i, err)
		}
	}
	normed := t.be.NewTensor(x.Rows, c.Hidden)
	defer t.be.Free(normed)
	t.be.RMSNorm(normed, x, t.w.FinalNorm, 0, c.NormEps)
	vals := download(t.be, normed)
	var merged []float32
	for _, s := range segs {
		merged = append(merged, mergeGroups(vals[s.lo*c.Hidden:s.hi*c.Hidden], s.h, s.w, c.Hidden, c.MergeH, c.MergeW)...)
	}
	rows := len(merged) / c.MergedWidth()
	y := t.project(merged, rows)
	feats = make([][]float32, len(imgs))
	r := 0
	for i, im := range imgs {
		n := c.Rows(im)
		feats[i] = y[r*c.TextHidden : (r+n)*c.TextHidden : (r+n)*c.TextHidden]
		r += n
	}
	return feats, nil
}
