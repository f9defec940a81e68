package model

import (
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
)

// ShardLayer returns rank s's slice of layer l (shard.go says which):
// l is bound unsplit, or with only some routed experts bound
// (MoEWeights.ExpertBase), as long as they include the rank's. Row slices
// are views of l's storage, so a rank that binds from a mapped checkpoint
// touches only its rows; column slices (the o_proj and down_proj inputs)
// are copies. l is not changed.
func ShardLayer(c *Config, l *Layer, s Shard) (*Layer, error) {
	if err := c.CheckShard(max(s.Ranks, 1)); err != nil {
		return nil, err
	}
	if !s.Split() {
		return l, nil
	}
	if s.Rank < 0 || s.Rank >= s.Ranks {
		return nil, fmt.Errorf("tensor rank %d is outside [0, %d)", s.Rank, s.Ranks)
	}
	out := *l
	var cut cutter
	if w := l.KDA; w != nil {
		out.KDA = cut.kda(c, w, s)
	}
	if w := l.MLA; w != nil {
		out.MLA = cut.mla(c, w, s)
	}
	if w := l.Dense; w != nil {
		out.Dense = cut.ffn(w, s)
	}
	if w := l.MoE; w != nil {
		out.MoE = cut.moe(c, w, s)
	}
	if cut.err != nil {
		return nil, fmt.Errorf("layer %d, %s: %w", l.Index, s, cut.err)
	}
	return &out, nil
}

// cutter slices weights, keeping the first error.
type cutter struct{ err error }

func (k *cutter) fail(err error) {
	if k.err == nil {
		k.err = err
	}
}

// kda keeps heads [h0, h1): their channels [h0·D, h1·D).
func (k *cutter) kda(c *Config, w *KDAWeights, s Shard) *KDAWeights {
	D := c.KDAHeadDim
	h0, h1 := s.Range(c.KDAHeads)
	c0, c1 := h0*D, h1*D
	return &KDAWeights{
		QProj: rowsOf(w.QProj, c0, c1), KProj: rowsOf(w.KProj, c0, c1), VProj: rowsOf(w.VProj, c0, c1),
		GProj: rowsOf(w.GProj, c0, c1), OProj: k.cols(w.OProj, c0, c1),
		FAProj: w.FAProj, FBProj: rowsOf(w.FBProj, c0, c1), BProj: rowsOf(w.BProj, h0, h1),
		QConv: convRows(w.QConv, c0, c1), KConv: convRows(w.KConv, c0, c1), VConv: convRows(w.VConv, c0, c1),
		ALog: w.ALog[h0:h1:h1], DtBias: w.DtBias[c0:c1:c1], ONorm: w.ONorm,
	}
}

// mla keeps query heads [h0, h1).
func (k *cutter) mla(c *Config, w *MLAWeights, s Shard) *MLAWeights {
	h0, h1 := s.Range(c.MLAHeads)
	q, kv, v := c.QHeadDim(), c.QKNopeDim+c.VHeadDim, c.VHeadDim
	return &MLAWeights{
		QAProj: w.QAProj, QANorm: w.QANorm, KVAProj: w.KVAProj, KVANorm: w.KVANorm,
		QBProj:  rowsOf(w.QBProj, h0*q, h1*q),
		KVBProj: rowsOf(w.KVBProj, h0*kv, h1*kv),
		GProj:   rowsOf(w.GProj, h0*v, h1*v),
		OProj:   k.cols(w.OProj, h0*v, h1*v),
	}
}

// ffn keeps a range of the intermediate width: gate and up rows, down
// columns.
func (k *cutter) ffn(w *FFNWeights, s Shard) *FFNWeights {
	i0, i1 := widthRange(s, w.GateProj.Rows)
	return &FFNWeights{GateProj: rowsOf(w.GateProj, i0, i1), UpProj: rowsOf(w.UpProj, i0, i1), DownProj: k.cols(w.DownProj, i0, i1)}
}

// moe keeps the rank's routed experts and its part of the shared expert.
func (k *cutter) moe(c *Config, w *MoEWeights, s Shard) *MoEWeights {
	out := *w
	e0, e1 := s.Range(c.NumExperts)
	lo, hi := e0-w.ExpertBase, e1-w.ExpertBase
	if lo < 0 || hi > len(w.Experts) {
		k.fail(fmt.Errorf("routed experts [%d, %d) are not bound (have [%d, %d))", e0, e1, w.ExpertBase, w.ExpertBase+len(w.Experts)))
		return nil
	}
	out.Experts, out.ExpertBase = w.Experts[lo:hi:hi], e0
	if w.Shared != nil {
		out.Shared = k.ffn(w.Shared, s)
	}
	return &out
}

// widthRange is the rank's range of an FFN width of n: in whole MX blocks
// when n allows, so that quantized down projections cut on block bounds.
func widthRange(s Shard, n int) (int, int) {
	if n%kernels.MXBlock == 0 && n/kernels.MXBlock >= s.Ranks {
		lo, hi := s.Range(n / kernels.MXBlock)
		return lo * kernels.MXBlock, hi * kernels.MXBlock
	}
	return s.Range(n)
}

// rowsOf is rows [r0, r1) of m, a view of its storage.
func rowsOf(m *kernels.Matrix, r0, r1 int) *kernels.Matrix {
	rb := m.Format.RowBytes(m.Cols)
	out := &kernels.Matrix{Name: m.Name, Rows: r1 - r0, Cols: m.Cols, Format: m.Format, Data: m.Data[r0*rb : r1*rb : r1*rb]}
	if m.Format.Scaled() {
		sb := m.Cols / kernels.MXBlock
		out.Scales = m.Scales[r0*sb : r1*sb : r1*sb]
	}
	return out
}

// cols is columns [c0, c1) of m, copied row by row; quantized matrices cut
// only on MX block bounds.
func (k *cutter) cols(m *kernels.Matrix, c0, c1 int) *kernels.Matrix {
	if m.Format.Scaled() && (c0%kernels.MXBlock != 0 || c1%kernels.MXBlock != 0) {
		k.fail(fmt.Errorf("weight %s is %s: its columns [%d, %d) do not fall on %d-element blocks", m.Name, m.Format, c0, c1, kernels.MXBlock))
		return nil
	}
	out := &kernels.Matrix{Name: m.Name, Rows: m.Rows, Cols: c1 - c0, Format: m.Format}
	out.Data = cutCols(m.Data, m.Rows, m.Format.RowBytes(m.Cols), m.Format.RowBytes(c0), m.Format.RowBytes(c1))
	if m.Format.Scaled() {
		out.Scales = cutCols(m.Scales, m.Rows, m.Cols/kernels.MXBlock, c0/kernels.MXBlock, c1/kernels.MXBlock)
	}
	if err := out.Check(); err != nil {
		k.fail(err)
	}
	return out
}

// cutCols copies bytes [b0, b1) of each of rows rows of rb bytes.
func cutCols(data []byte, rows, rb, b0, b1 int) []byte {
	n := b1 - b0
	out := make([]byte, rows*n)
	for r := 0; r < rows; r++ {
		copy(out[r*n:(r+1)*n], data[r*rb+b0:r*rb+b1])
	}
	return out
}

// convRows is channels [c0, c1) of a short-conv weight [P, K].
func convRows(t *kernels.Tensor, c0, c1 int) *kernels.Tensor {
	K := t.Cols
	return &kernels.Tensor{Rows: c1 - c0, Cols: K, Data: t.Data[c0*K : c1*K : c1*K]}
}

// ShardGlobals returns rank s's globals: the embedding and final mix
// replicated, the lm_head's rows of the rank's vocabulary range.
func ShardGlobals(c *Config, g *Globals, s Shard) *Globals {
	if !s.Split() || g == nil {
		return g
	}
	out := *g
	if g.LMHead != nil {
		v0, v1 := s.Range(c.VocabSize)
		out.LMHead, out.VocabBase = rowsOf(g.LMHead, v0, v1), v0
	}
	return &out
}

// ShardOf returns rank s of a stage split from m, a holder of unsplit
// weights: its layers and lm_head are views and copies of m's, its new
// states hold its KDA heads, and r sums its partial outputs with the other
// ranks'. The ranks of a stage run in one process this way (tests); a
// decode rank binds only its slices (Load with LoadOptions.Shard).
func (m *Model) ShardOf(s Shard, r Reducer) (*Model, error) {
	if err := m.Cfg.CheckShard(max(s.Ranks, 1)); err != nil {
		return nil, err
	}
	out := *m
	out.Layers = make([]*Layer, len(m.Layers))
	out.Shard, out.Reduce, out.State.Shard = s, r, s
	out.Globals = ShardGlobals(m.Cfg, m.Globals, s)
	if g := out.Globals; g != nil && g != m.Globals && g.LMHead != nil {
		if err := m.Backend.Bind(g.LMHead); err != nil {
			return nil, err
		}
	}
	for L, l := range m.Layers {
		if l == nil {
			continue
		}
		sl, err := ShardLayer(m.Cfg, l, s)
		if err == nil && sl != l {
			err = bindAll(m.Backend, sl)
		}
		if err != nil {
			return nil, err
		}
		out.Layers[L] = sl
	}
	return &out, nil
}
