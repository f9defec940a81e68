package model

import (
	"context"
	"fmt"
	"sync"

	"github.com/tandem-inference/tandem/kernels"
)

// Verification of drafted tokens (speculative decoding). In PhaseDecode a
// sequence whose span has r > 1 rows is a verify span: its last sampled
// token followed by r-1 drafted ones. Every op gives each row exactly the
// bits it gets when that token is decoded alone (the ops are row-independent
// and the sequence ops run the decode forms token by token), so the logits
// of row i are those plain decoding computes after the first i drafts.
//
// Only some of the rows will be accepted, and a KDA layer's state cannot be
// cut back like an MLA cache. So a verify span runs each KDA layer's
// recurrence and short convs on a scratch copy of the layer's state (reused
// from layer to layer, never kept per sequence) and keeps, per layer, the
// inputs of those ops for its rows: the pre-conv projections of q, k and v,
// and the delta rule's k, v, g and beta. MLA layers append all r latent rows.
// The sequence's state is then pending: Tokens does not count the rows, and
// the next step must wait for Commit, which rolls every KDA layer forward over
// the accepted rows only, from the state before the step and with the same
// decode kernels (chunk 0), and cuts the MLA caches back: the state is then
// bit-identical to decoding the accepted tokens one at a time.

// verifyPending is a sequence's uncommitted verify step on this holder.
type verifyPending struct {
	rows   int
	layers []*layerPending // by layer index; nil where not run
}

// layerPending is one layer's share of a verify step.
type layerPending struct {
	latent int                // MLA: cache rows before the step
	conv   [3]*kernels.Tensor // KDA: pre-conv projected q, k, v [rows, P]
	k, v   *kernels.Tensor    // KDA: delta-rule inputs after conv and norm [rows, P]
	g      *kernels.Tensor    // log decay [rows, P]
	beta   *kernels.Tensor    // [rows, H]
}

// isVerify reports whether span is a verify span in phase.
func isVerify(phase Phase, span kernels.Span) bool {
	return phase == PhaseDecode && span.Len() > 1
}

// Pending is the number of rows of the sequence's uncommitted verify step
// on this holder (0: none).
func (s *SeqState) Pending() int {
	if s.verify == nil {
		return 0
	}
	return s.verify.rows
}

// startVerify makes layer L's record of each verify span of the batch (nil
// for the other sequences); RunLayer checked that none is there yet.
func (m *Model) startVerify(L int, b *Batch, phase Phase) []*layerPending {
	out := make([]*layerPending, len(b.Seqs))
	for i, s := range b.Seqs {
		sp := b.Spans[i]
		if !isVerify(phase, sp) {
			continue
		}
		if s.verify == nil {
			s.verify = &verifyPending{rows: sp.Len(), layers: make([]*layerPending, len(s.Layers))}
		}
		out[i] = &layerPending{}
		s.verify.layers[L] = out[i]
	}
	return out
}

// checkVerify refuses a batch whose sequences cannot run layer L: one
// with a verify step pending that this batch does not continue.
func checkVerify(L int, b *Batch, phase Phase) error {
	for i, s := range b.Seqs {
		if s == nil || s.verify == nil {
			continue
		}
		if !isVerify(phase, b.Spans[i]) || s.verify.rows != b.Spans[i].Len() || s.verify.layers[L] != nil {
			return fmt.Errorf("model: sequence %d has an uncommitted verify step of %d rows (commit it before its next step)", i, s.verify.rows)
		}
	}
	return nil
}

// keepRows copies rows [lo, lo+n) of t into a new tensor.
func (m *Model) keepRows(t *kernels.Tensor, lo, n int) *kernels.Tensor {
	out := m.Backend.NewTensor(n, t.Cols)
	m.Backend.CopyBlock(out, 0, 0, t, lo, 0, n, t.Cols)
	return out
}

// scratchPool holds the copies of layer state a verify span runs on.
var scratchPool sync.Pool

// scratch returns a copy of host from the pool; give it back with
// putScratch.
func scratch(host []float32) *[]float32 {
	p, _ := scratchPool.Get().(*[]float32)
	if p == nil {
		p = new([]float32)
	}
	if cap(*p) < len(host) {
		*p = make([]float32, len(host))
	}
	*p = (*p)[:len(host)]
	copy(*p, host)
	return p
}

func putScratch(p *[]float32) { scratchPool.Put(p) }

// Commit ends the sequence's pending verify step on this holder, keeping
// its first n rows (the last sampled token and the n-1 drafts accepted
// after it): every KDA layer's state and conv tails roll forward over those
// rows from where the step found them, every MLA cache keeps their latent
// rows, and Tokens counts them. n = 0 undoes the step. A sequence with no
// pending step takes only n = 0.
func (m *Model) Commit(s *SeqState, n int) error {
	v := s.verify
	if v == nil {
		if n != 0 {
			return fmt.Errorf("model: commit of %d rows, but no verify step is pending", n)
		}
		return nil
	}
	if n < 0 || n > v.rows {
		return fmt.Errorf("model: commit of %d rows of a verify step of %d", n, v.rows)
	}
	for L, lp := range v.layers {
		if lp == nil {
			continue
		}
		ls := s.Layers[L]
		switch ls.Kind {
		case MLA:
			part := ls.Part(PartLatent)
			keep := lp.latent + n
			part.Data = part.Data[:keep*part.Shape[1]*part.DType.Size()]
			part.Shape[0] = keep
		case KDA:
			if err := m.rollKDA(L, ls, lp, n); err != nil {
				return err
			}
		}
	}
	m.dropPending(s)
	s.Tokens += n
	return nil
}

// dropPending frees a pending verify step's tensors.
func (m *Model) dropPending(s *SeqState) {
	if s.verify == nil {
		return
	}
	for _, lp := range s.verify.layers {
		if lp == nil {
			continue
		}
		for _, t := range []*kernels.Tensor{lp.conv[0], lp.conv[1], lp.conv[2], lp.k, lp.v, lp.g, lp.beta} {
			if t != nil { // an MLA layer's record holds none
				m.Backend.Free(t)
			}
		}
	}
	s.verify = nil
}

// rollKDA runs KDA layer L's decode kernels over the first n kept rows
// with the layer's real state: the short convs for their tails (outputs
// thrown away) and the delta rule for S (q only shapes the output, which is
// thrown away: k stands in for it).
func (m *Model) rollKDA(L int, ls *LayerState, lp *layerPending, n int) error {
	if n == 0 {
		return nil
	}
	l := m.Layers[L]
	if l == nil || l.KDA == nil {
		return fmt.Errorf("model: commit needs KDA layer %d's weights on this holder", L)
	}
	be, c, w := m.Backend, m.Cfg, l.KDA
	H, D, K1 := w.BProj.Rows, c.KDAHeadDim, w.QConv.Cols-1 // this holder's heads
	P := H * D
	span := kernels.Span{Lo: 0, Hi: n}
	out := be.NewTensor(n, P)
	defer be.Free(out)
	for j, cw := range []*kernels.Tensor{w.QConv, w.KConv, w.VConv} {
		host := ls.Part(PartConvQ + PartKind(j)).F32()
		tail := be.AttachState(host, P, K1)
		be.ShortConvSiLU(out, lp.conv[j], span, cw, tail)
		be.DetachState(tail, host)
	}
	host := ls.Part(PartKDAState).F32()
	S := be.AttachState(host, H*D, D)
	be.KDA(out, lp.k, lp.k, lp.v, lp.g, lp.beta, span, S, H, D, D, 0)
	be.DetachState(S, host)
	return nil
}

// Verify runs one decode step in which sequence i takes tokens[i] (its
// last sampled token, then any drafts) and returns the logits of every row
// of every sequence. A sequence of one token advances as in Decode; one of
// more is left pending until Commit.
func (m *Model) Verify(ctx context.Context, seqs []*SeqState, tokens [][]int32) ([][][]float32, error) {
	b, err := m.NewBatch(seqs, tokens)
	if err != nil {
		return nil, err
	}
	defer m.FreeBatch(b)
	if err := m.ForwardLayers(ctx, 0, m.Cfg.NumLayers, b, PhaseDecode); err != nil {
		return nil, err
	}
	b.Advance()
	return m.RowLogits(b)
}
