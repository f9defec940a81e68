package model

import (
	"fmt"
	"math"
	"reflect"
	"strings"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// TensorSource resolves checkpoint tensor names: an mmapped checkpoint, a
// layer read by the weight streamer into a staging buffer, or a test table.
type TensorSource interface {
	// Meta returns a tensor's header facts, ok false when absent.
	Meta(name string) (TensorMeta, bool)
	// Data returns the tensor's bytes (a view; not copied).
	Data(name string) ([]byte, error)
}

// TensorMeta is what a safetensors header says of a tensor.
type TensorMeta struct {
	DType string // safetensors dtype: "BF16", "F32", "U8", "F8_E4M3", ...
	Shape []int64
}

// LayerPrefix is the released name prefix of text layer L.
func LayerPrefix(L int) string { return fmt.Sprintf("language_model.model.layers.%d.", L) }

// BindLayer binds layer L's weights from src and checks every shape against
// the config. A missing or malformed tensor is reported by its name.
func BindLayer(c *Config, L int, src TensorSource) (*Layer, error) {
	return bindLayer(c, L, src, 0, c.NumExperts)
}

// BindLayerShard binds tensor rank s's slices of layer L (shard.go): the
// routed experts of other ranks are not even looked at.
func BindLayerShard(c *Config, L int, src TensorSource, s Shard) (*Layer, error) {
	e0, e1 := s.Range(c.NumExperts)
	l, err := bindLayer(c, L, src, e0, e1)
	if err != nil {
		return nil, err
	}
	return ShardLayer(c, l, s)
}

// bindLayer binds layer L with routed experts [e0, e1).
func bindLayer(c *Config, L int, src TensorSource, e0, e1 int) (*Layer, error) {
	l := &Layer{Index: L, Kind: c.LayerKind(L)}
	b := binder{src: src}
	prefix := LayerPrefix(L)
	b.bindFields(l, prefix)
	switch l.Kind {
	case KDA:
		l.KDA = &KDAWeights{}
		b.bindFields(l.KDA, prefix+"self_attn.")
	case MLA:
		l.MLA = &MLAWeights{}
		b.bindFields(l.MLA, prefix+"self_attn.")
	}
	if c.IsDense(L) {
		l.Dense = &FFNWeights{}
		b.bindFields(l.Dense, prefix+"mlp.")
	} else {
		l.MoE = &MoEWeights{Shared: &FFNWeights{}}
		p := prefix + "block_sparse_moe."
		b.bindFields(l.MoE, p)
		if c.NumShared == 0 {
			l.MoE.Shared = nil
		} else {
			b.bindFields(l.MoE.Shared, p+"shared_experts.")
		}
		l.MoE.Experts, l.MoE.ExpertBase = make([]kernels.Expert, e1-e0), e0
		for i := range l.MoE.Experts {
			ep := fmt.Sprintf("%sexperts.%d.", p, e0+i)
			l.MoE.Experts[i] = kernels.Expert{W1: b.matrix(ep + "w1"), W3: b.matrix(ep + "w3"), W2: b.matrix(ep + "w2")}
			if b.err != nil {
				break
			}
		}
	}
	if b.err != nil {
		return nil, fmt.Errorf("layer %d: %w", L, b.err)
	}
	if err := l.check(c); err != nil {
		return nil, fmt.Errorf("layer %d: %w", L, err)
	}
	if l.KDA != nil {
		l.KDA.ALog = l.KDA.ALog[:c.KDAHeads] // the release pads A_log; only the first H are heads
	}
	l.fold()
	return l, nil
}

// BindGlobals binds the embedding, final AttnRes mix, norm and lm_head.
func BindGlobals(c *Config, src TensorSource) (*Globals, error) {
	g := &Globals{}
	b := binder{src: src}
	b.bindFields(g, "")
	if b.err != nil {
		return nil, b.err
	}
	var s shapeCheck
	s.mat(g.Embed, c.VocabSize, c.HiddenSize)
	s.mat(g.LMHead, c.VocabSize, c.HiddenSize)
	s.vec("norm", g.Norm, c.HiddenSize)
	s.vec("output_attn_res_norm", g.OutResNorm, c.HiddenSize)
	s.vec("output_attn_res_proj", g.OutResProjW, c.HiddenSize)
	if s.err != nil {
		return nil, s.err
	}
	g.fold()
	return g, nil
}

// binder fills tagged struct fields from a TensorSource, keeping the first
// error (later calls are no-ops after it).
type binder struct {
	src TensorSource
	err error
}

func (b *binder) fail(format string, args ...any) {
	if b.err == nil {
		b.err = fmt.Errorf(format, args...)
	}
}

var (
	matrixType = reflect.TypeOf((*kernels.Matrix)(nil))
	tensorType = reflect.TypeOf((*kernels.Tensor)(nil))
	vecType    = reflect.TypeOf([]float32(nil))
)

// bindFields binds the leaf fields (matrices, vectors, conv tensors) of the
// struct pointed to by v; nested weight structs are bound by the caller.
func (b *binder) bindFields(v any, prefix string) {
	rv := reflect.ValueOf(v).Elem()
	rt := rv.Type()
	for i := 0; i < rt.NumField() && b.err == nil; i++ {
		f := rt.Field(i)
		tag, ok := f.Tag.Lookup("k3")
		if !ok {
			continue
		}
		name, opt, _ := strings.Cut(tag, ",")
		switch f.Type {
		case matrixType:
			rv.Field(i).Set(reflect.ValueOf(b.matrix(prefix + name)))
		case vecType:
			rv.Field(i).Set(reflect.ValueOf(b.vector(prefix+name, opt == "row")))
		case tensorType:
			rv.Field(i).Set(reflect.ValueOf(b.conv(prefix + name)))
		}
	}
}

// matrix binds a weight by its base name, deciding the storage format from
// the header: base.weight_packed + base.weight_scale is MXFP4; an F8
// base.weight + base.weight_scale is MXFP8; otherwise a dense base.weight.
func (b *binder) matrix(base string) *kernels.Matrix {
	if b.err != nil {
		return nil
	}
	m := &kernels.Matrix{Name: base}
	if packed, ok := b.src.Meta(base + ".weight_packed"); ok {
		scale, ok := b.src.Meta(base + ".weight_scale")
		if !ok {
			b.fail("tensor %s.weight_packed has no %s.weight_scale (MXFP4 needs both)", base, base)
			return nil
		}
		if packed.DType != "U8" || scale.DType != "U8" || len(packed.Shape) != 2 || len(scale.Shape) != 2 {
			b.fail("MXFP4 weight %s: want U8 2-D weight_packed and weight_scale, have %s %v and %s %v", base, packed.DType, packed.Shape, scale.DType, scale.Shape)
			return nil
		}
		m.Format = kernels.MXFP4
		m.Rows, m.Cols = int(packed.Shape[0]), int(packed.Shape[1])*2
		if scale.Shape[0] != packed.Shape[0] || int(scale.Shape[1])*kernels.MXBlock != m.Cols {
			b.fail("MXFP4 weight %s: weight_scale %v does not match weight_packed %v (want [%d, %d])", base, scale.Shape, packed.Shape, m.Rows, m.Cols/kernels.MXBlock)
			return nil
		}
		m.Data = b.data(base + ".weight_packed")
		m.Scales = b.data(base + ".weight_scale")
		b.checkScales(base, m.Scales)
		return m
	}
	w, ok := b.src.Meta(base + ".weight")
	if !ok {
		b.fail("tensor %s.weight is missing", base)
		return nil
	}
	if len(w.Shape) != 2 {
		b.fail("weight %s.weight: want a 2-D matrix, have shape %v", base, w.Shape)
		return nil
	}
	m.Rows, m.Cols = int(w.Shape[0]), int(w.Shape[1])
	switch w.DType {
	case "BF16":
		m.Format = kernels.BF16
	case "F16":
		m.Format = kernels.F16
	case "F32":
		m.Format = kernels.F32
	case "F8_E4M3", "F8_E5M2":
		m.Format = kernels.MXFP8E4M3
		if w.DType == "F8_E5M2" {
			m.Format = kernels.MXFP8E5M2
		}
		scale, ok := b.src.Meta(base + ".weight_scale")
		if !ok {
			b.fail("FP8 weight %s.weight has no %s.weight_scale (only MXFP8 with E8M0 block scales is supported)", base, base)
			return nil
		}
		if scale.DType != "U8" || len(scale.Shape) != 2 || scale.Shape[0] != w.Shape[0] || int(scale.Shape[1])*kernels.MXBlock != m.Cols {
			b.fail("MXFP8 weight %s: weight_scale %s %v does not match weight %v (want U8 [%d, %d])", base, scale.DType, scale.Shape, w.Shape, m.Rows, m.Cols/kernels.MXBlock)
			return nil
		}
		m.Scales = b.data(base + ".weight_scale")
		b.checkScales(base, m.Scales)
	default:
		b.fail("weight %s.weight has dtype %s; want BF16, F16, F32 or F8 with block scales", base, w.DType)
		return nil
	}
	m.Data = b.data(base + ".weight")
	if b.err == nil {
		if err := m.Check(); err != nil {
			b.fail("%w", err)
		}
	}
	return m
}

func (b *binder) checkScales(base string, scales []byte) {
	if b.err == nil {
		if err := mxfp.CheckScales(scales); err != nil {
			b.fail("weight %s.weight_scale: %w", base, err)
		}
	}
}

func (b *binder) data(name string) []byte {
	if b.err != nil {
		return nil
	}
	d, err := b.src.Data(name)
	if err != nil {
		b.fail("tensor %s: %w", name, err)
	}
	return d
}

// vector widens a 1-D float tensor (or a [1, n] one when row is set) to fp32.
func (b *binder) vector(name string, row bool) []float32 {
	if b.err != nil {
		return nil
	}
	meta, ok := b.src.Meta(name)
	if !ok {
		b.fail("tensor %s is missing", name)
		return nil
	}
	n := int64(1)
	for _, d := range meta.Shape {
		n *= d
	}
	if !(len(meta.Shape) == 1 || row && len(meta.Shape) == 2 && meta.Shape[0] == 1) {
		b.fail("tensor %s: want a vector, have shape %v", name, meta.Shape)
		return nil
	}
	return b.floats(name, meta, int(n))
}

// conv binds a depthwise conv weight [P, 1, K] as a [P, K] tensor.
func (b *binder) conv(name string) *kernels.Tensor {
	if b.err != nil {
		return nil
	}
	meta, ok := b.src.Meta(name)
	if !ok {
		b.fail("tensor %s is missing", name)
		return nil
	}
	if len(meta.Shape) != 3 || meta.Shape[1] != 1 {
		b.fail("tensor %s: want a depthwise conv weight [P, 1, K], have shape %v", name, meta.Shape)
		return nil
	}
	P, K := int(meta.Shape[0]), int(meta.Shape[2])
	f := b.floats(name, meta, P*K)
	if f == nil {
		return nil
	}
	return &kernels.Tensor{Rows: P, Cols: K, Data: f}
}

// floats converts n elements of a BF16/F16/F32 tensor to a new fp32 slice,
// refusing a NaN or an infinity: these small tensors (norms, biases, conv
// kernels, A_log) are read here anyway, and one bad value would silently
// turn every output into NaN. (Quantized matrices' block scales are checked
// in checkScales; the elements of dense matrices are not read at load.)
func (b *binder) floats(name string, meta TensorMeta, n int) []float32 {
	out := b.convert(name, meta, n)
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			b.fail("tensor %s: element %d of %d is %v", name, i, n, v)
			return nil
		}
	}
	return out
}

func (b *binder) convert(name string, meta TensorMeta, n int) []float32 {
	d := b.data(name)
	if b.err != nil {
		return nil
	}
	out := make([]float32, n)
	switch meta.DType {
	case "F32":
		if len(d) != 4*n {
			break
		}
		for i := range out {
			out[i] = f32at(d, i)
		}
		return out
	case "BF16", "F16":
		if len(d) != 2*n {
			break
		}
		for i := range out {
			u := uint16(d[2*i]) | uint16(d[2*i+1])<<8
			if meta.DType == "BF16" {
				out[i] = mxfp.BF16ToF32(u)
			} else {
				out[i] = mxfp.F16ToF32(u)
			}
		}
		return out
	default:
		b.fail("tensor %s has dtype %s; want BF16, F16 or F32", name, meta.DType)
		return nil
	}
	b.fail("tensor %s: %d bytes for %d %s elements", name, len(d), n, meta.DType)
	return nil
}
