package conformance

import (
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
)

// Opaque is the CPU backend with its tensors' values hidden the way a
// device backend hides them: Data is nil and the values sit behind Dev.
// Code that honours the device-memory contract (model, executor) computes
// exactly the CPU's results on it; code that reads or writes Tensor.Data
// of a backend tensor panics or sees nothing. Tests run the model and the
// prefill executor on it to keep them device-clean.
type Opaque struct{ CPU *cpu.Backend }

// opaqueBuf holds a tensor's values; a view shares them.
type opaqueBuf struct{ v []float32 }

func (o *opaqueBuf) RowsView(lo, hi, cols int) any { return &opaqueBuf{v: o.v[lo*cols : hi*cols]} }

var (
	_ kernels.Backend    = Opaque{}
	_ kernels.RowsViewer = (*opaqueBuf)(nil)
)

// h is the host tensor behind t (t itself when t is a host tensor the
// caller made, such as a conv weight).
func h(t *kernels.Tensor) *kernels.Tensor {
	if t == nil {
		return nil
	}
	if b, ok := t.Dev.(*opaqueBuf); ok {
		return &kernels.Tensor{Rows: t.Rows, Cols: t.Cols, Data: b.v[:t.Rows*t.Cols]}
	}
	return t
}

func hide(t *kernels.Tensor) *kernels.Tensor {
	return &kernels.Tensor{Rows: t.Rows, Cols: t.Cols, Dev: &opaqueBuf{v: t.Data}}
}

func (o Opaque) Name() string                       { return "cpu-opaque" }
func (o Opaque) Threads() int                       { return o.CPU.Threads() }
func (o Opaque) AllocHost(n int) ([]byte, error)    { return o.CPU.AllocHost(n) }
func (o Opaque) FreeHost(b []byte)                  { o.CPU.FreeHost(b) }
func (o Opaque) Bind(m *kernels.Matrix) error       { return o.CPU.Bind(m) }
func (o Opaque) Release(m *kernels.Matrix)          { o.CPU.Release(m) }
func (o Opaque) NewTensor(r, c int) *kernels.Tensor { return hide(o.CPU.NewTensor(r, c)) }
func (o Opaque) Free(t *kernels.Tensor)             { t.Dev = nil }
func (o Opaque) Upload(dst *kernels.Tensor, src []float32) {
	o.CPU.Upload(h(dst), src)
}
func (o Opaque) Download(dst []float32, src *kernels.Tensor) { o.CPU.Download(dst, h(src)) }
func (o Opaque) CopyBlock(dst *kernels.Tensor, dr, dc int, src *kernels.Tensor, sr, sc, rows, cols int) {
	hd, hs := h(dst), h(src)
	if dst == src {
		hs = hd // the same tensor: the CPU's overlap rule needs one
	}
	o.CPU.CopyBlock(hd, dr, dc, hs, sr, sc, rows, cols)
}
func (o Opaque) AttachState(host []float32, rows, cols int) *kernels.Tensor {
	return hide(o.CPU.AttachState(host, rows, cols))
}
func (o Opaque) DetachState(t *kernels.Tensor, host []float32)  { o.CPU.DetachState(h(t), host) }
func (o Opaque) AttachLatent(c *kernels.LatentCache, valid int) { o.CPU.AttachLatent(c, valid) }
func (o Opaque) DetachLatent(c *kernels.LatentCache, from int)  { o.CPU.DetachLatent(c, from) }

func (o Opaque) Embed(dst *kernels.Tensor, table *kernels.Matrix, ids []int32) {
	o.CPU.Embed(h(dst), table, ids)
}
func (o Opaque) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) { o.CPU.MatMul(h(dst), h(x), w) }
func (o Opaque) RMSNorm(dst, x *kernels.Tensor, w []float32, group int, eps float32) {
	o.CPU.RMSNorm(h(dst), h(x), w, group, eps)
}
func (o Opaque) L2NormGroups(x *kernels.Tensor, group int, eps, scale float32) {
	o.CPU.L2NormGroups(h(x), group, eps, scale)
}
func (o Opaque) Add(dst, a, b *kernels.Tensor)             { o.CPU.Add(h(dst), h(a), h(b)) }
func (o Opaque) AddBias(x *kernels.Tensor, bias []float32) { o.CPU.AddBias(h(x), bias) }
func (o Opaque) Sigmoid(x *kernels.Tensor)                 { o.CPU.Sigmoid(h(x)) }
func (o Opaque) MulSigmoid(x, gate *kernels.Tensor)        { o.CPU.MulSigmoid(h(x), h(gate)) }
func (o Opaque) SiTUMLP(dst, x *kernels.Tensor, gate, up, down *kernels.Matrix, b1, b2 float32) {
	o.CPU.SiTUMLP(h(dst), h(x), gate, up, down, b1, b2)
}
func (o Opaque) AttnResMix(dst *kernels.Tensor, sources []*kernels.Tensor, proj []float32, eps float32) {
	hs := make([]*kernels.Tensor, len(sources))
	for i, s := range sources {
		hs[i] = h(s)
	}
	o.CPU.AttnResMix(h(dst), hs, proj, eps)
}
func (o Opaque) ShortConvSiLU(dst, x *kernels.Tensor, span kernels.Span, w, tail *kernels.Tensor) {
	o.CPU.ShortConvSiLU(h(dst), h(x), span, h(w), h(tail))
}
func (o Opaque) KDAGate(z *kernels.Tensor, aLog []float32, headDim int, lower float32) {
	o.CPU.KDAGate(h(z), aLog, headDim, lower)
}
func (o Opaque) KDA(out, q, k, v, g, beta *kernels.Tensor, span kernels.Span, S *kernels.Tensor, heads, dk, dv, chunk int) {
	o.CPU.KDA(h(out), h(q), h(k), h(v), h(g), h(beta), span, h(S), heads, dk, dv, chunk)
}
func (o Opaque) WriteLatent(c *kernels.LatentCache, row int, src *kernels.Tensor, srcRow, n int) {
	o.CPU.WriteLatent(c, row, h(src), srcRow, n)
}
func (o Opaque) MLAAttention(out, q *kernels.Tensor, span kernels.Span, c *kernels.LatentCache, kvb *kernels.Matrix, heads, nope, rope, vdim int, scale float32, absorb bool) {
	o.CPU.MLAAttention(h(out), h(q), span, c, kvb, heads, nope, rope, vdim, scale, absorb)
}
func (o Opaque) RouterTopK(logits *kernels.Tensor, bias []float32, k int, renorm bool, scale float32, ids []int32, weights []float32) {
	o.CPU.RouterTopK(h(logits), bias, k, renorm, scale, ids, weights)
}
func (o Opaque) RoutedExperts(u, z *kernels.Tensor, ids []int32, weights []float32, k int, experts []kernels.Expert, b1, b2 float32) {
	o.CPU.RoutedExperts(h(u), h(z), ids, weights, k, experts, b1, b2)
}
