package vision

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/mxfp"
)

// Released tensor names (the checkpoint's last two shards).
const (
	namePatchEmbed = "vision_tower.patch_embed.proj.weight"
	namePosEmb     = "vision_tower.patch_embed.pos_emb.weight"
	nameFinalNorm  = "vision_tower.encoder.final_layernorm.weight"
	nameProj0      = "mm_projector.proj.0.weight"
	nameProj2      = "mm_projector.proj.2.weight"
	namePostNorm   = "mm_projector.post_norm.weight"
)

// BlockPrefix is the released name prefix of encoder block i.
func BlockPrefix(i int) string { return fmt.Sprintf("vision_tower.encoder.blocks.%d.", i) }

// Weights are the tower's and projector's weights: matrices in their
// checkpoint format (used in place), vectors and the position table
// widened to fp32.
type Weights struct {
	PatchEmbed *kernels.Matrix // [Hidden, 3*Patch*Patch]: the conv kernel flattened (c, y, x)
	PosEmb     []float32       // [PosH, PosW, Hidden]
	Blocks     []BlockWeights
	FinalNorm  []float32       // [Hidden]
	Proj0      *kernels.Matrix // [MergedWidth, MergedWidth]
	Proj2      *kernels.Matrix // [TextHidden, MergedWidth]
	PostNorm   []float32       // [TextHidden]
}

// BlockWeights are one encoder block's weights.
type BlockWeights struct {
	Norm0, Norm1 []float32       // [Hidden]
	WQKV         *kernels.Matrix // [3*QKV, Hidden]: q, then k, then v, each heads x head width
	WO           *kernels.Matrix // [Hidden, QKV]
	FC0          *kernels.Matrix // [Intermediate, Hidden]
	FC1          *kernels.Matrix // [Hidden, Intermediate]
}

// Matrices lists every weight matrix.
func (w *Weights) Matrices() []*kernels.Matrix {
	out := []*kernels.Matrix{w.PatchEmbed, w.Proj0, w.Proj2}
	for _, b := range w.Blocks {
		out = append(out, b.WQKV, b.WO, b.FC0, b.FC1)
	}
	return out
}

// Load opens the checkpoint in dir (config.json and the released shards),
// reads its vision_config and binds the vision tower's and projector's
// weights on be. A checkpoint without them gives an error wrapping
// ErrNoVisionTower.
func Load(ctx context.Context, be kernels.Backend, dir string) (*Tower, error) {
	tc, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	cfg, err := ParseConfig(tc.Vision, tc.HiddenSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ck, err := safetensors.Open(dir)
	if err != nil {
		return nil, err
	}
	w, err := BindWeights(cfg, model.CheckpointSource{C: ck})
	if err != nil {
		ck.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	t, err := New(be, cfg, w)
	if err != nil {
		ck.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	t.closer = ck.Close
	return t, nil
}

// BindWeights binds every vision tensor from src and checks its shape
// against cfg; a missing or malformed tensor is reported by its name.
func BindWeights(cfg *Config, src model.TensorSource) (*Weights, error) {
	if _, ok := src.Meta(namePatchEmbed); !ok {
		return nil, fmt.Errorf("no tensor %s: %w", namePatchEmbed, ErrNoVisionTower)
	}
	b := &binder{src: src}
	d, p := cfg.Hidden, cfg.Patch
	w := &Weights{
		PatchEmbed: b.matrix(namePatchEmbed, []int{d, 3, p, p}),
		PosEmb:     b.floats(namePosEmb, []int{cfg.PosH, cfg.PosW, d}),
		FinalNorm:  b.floats(nameFinalNorm, []int{d}),
		Proj0:      b.matrix(nameProj0, []int{cfg.MergedWidth(), cfg.MergedWidth()}),
		Proj2:      b.matrix(nameProj2, []int{cfg.TextHidden, cfg.MergedWidth()}),
		PostNorm:   b.floats(namePostNorm, []int{cfg.TextHidden}),
	}
	for i := 0; i < cfg.Layers && b.err == nil; i++ {
		pre := BlockPrefix(i)
		w.Blocks = append(w.Blocks, BlockWeights{
			Norm0: b.floats(pre+"norm0.weight", []int{d}),
			Norm1: b.floats(pre+"norm1.weight", []int{d}),
			WQKV:  b.matrix(pre+"wqkv.weight", []int{3 * cfg.QKV, d}),
			WO:    b.matrix(pre+"wo.weight", []int{d, cfg.QKV}),
			FC0:   b.matrix(pre+"mlp.fc0.weight", []int{cfg.Intermediate, d}),
			FC1:   b.matrix(pre+"mlp.fc1.weight", []int{d, cfg.Intermediate}),
		})
	}
	if b.err != nil {
		return nil, b.err
	}
	return w, nil
}

// binder reads tensors from a source, keeping the first error.
type binder struct {
	src model.TensorSource
	err error
}

// meta returns a tensor's header, checking its shape against want.
func (b *binder) meta(name string, want []int) (model.TensorMeta, bool) {
	if b.err != nil {
		return model.TensorMeta{}, false
	}
	m, ok := b.src.Meta(name)
	if !ok {
		b.err = fmt.Errorf("tensor %s is missing (the vision tower needs it, shape %v)", name, want)
		return m, false
	}
	shape := make([]int, len(m.Shape))
	for i, v := range m.Shape {
		shape[i] = int(v)
	}
	if !slices.Equal(shape, want) {
		b.err = fmt.Errorf("tensor %s has shape %v; vision_config needs %v", name, m.Shape, want)
		return m, false
	}
	return m, true
}

// matrix binds a dense weight as [shape[0], product of the rest].
func (b *binder) matrix(name string, shape []int) *kernels.Matrix {
	m, ok := b.meta(name, shape)
	if !ok {
		return nil
	}
	cols := 1
	for _, v := range shape[1:] {
		cols *= v
	}
	w := &kernels.Matrix{Name: name, Rows: shape[0], Cols: cols}
	switch m.DType {
	case "BF16":
		w.Format = kernels.BF16
	case "F16":
		w.Format = kernels.F16
	case "F32":
		w.Format = kernels.F32
	default:
		b.err = fmt.Errorf("tensor %s has dtype %s; the vision tower reads BF16, F16 or F32", name, m.DType)
		return nil
	}
	if w.Data, b.err = b.src.Data(name); b.err != nil {
		b.err = fmt.Errorf("tensor %s: %w", name, b.err)
		return nil
	}
	if err := w.Check(); err != nil {
		b.err = err
		return nil
	}
	return w
}

// floats reads a small float tensor (a norm's weight, the position table)
// widened to fp32, refusing NaN and infinities: one would silently turn
// every feature into NaN.
func (b *binder) floats(name string, shape []int) []float32 {
	m, ok := b.meta(name, shape)
	if !ok {
		return nil
	}
	n := 1
	for _, v := range shape {
		n *= v
	}
	d, err := b.src.Data(name)
	if err != nil {
		b.err = fmt.Errorf("tensor %s: %w", name, err)
		return nil
	}
	size := map[string]int{"F32": 4, "BF16": 2, "F16": 2}[m.DType]
	if size == 0 {
		b.err = fmt.Errorf("tensor %s has dtype %s; the vision tower reads BF16, F16 or F32", name, m.DType)
		return nil
	}
	if len(d) != n*size {
		b.err = fmt.Errorf("tensor %s: %d bytes for %d %s elements", name, len(d), n, m.DType)
		return nil
	}
	out := make([]float32, n)
	for i := range out {
		switch m.DType {
		case "F32":
			out[i] = math.Float32frombits(uint32(d[4*i]) | uint32(d[4*i+1])<<8 | uint32(d[4*i+2])<<16 | uint32(d[4*i+3])<<24)
		case "BF16":
			out[i] = mxfp.BF16ToF32(uint16(d[2*i]) | uint16(d[2*i+1])<<8)
		case "F16":
			out[i] = mxfp.F16ToF32(uint16(d[2*i]) | uint16(d[2*i+1])<<8)
		}
		if v := float64(out[i]); math.IsNaN(v) || math.IsInf(v, 0) {
			b.err = fmt.Errorf("tensor %s: element %d of %d is %v", name, i, n, v)
			return nil
		}
	}
	return out
}
