package model

import (
	"context"

	"github.com/tandem-inference/tandem/kernels"
)

// Calls cuts one layer over a batch into several calls of bounded work, so
// that a sequence cancelled or past its deadline can leave the batch in the
// middle of a long layer instead of at its end. Cut on the KDAChunk grid of
// each sequence, the calls compute exactly what one call over the batch does
// (bit for bit).
type Calls struct {
	// Tile bounds the rows of one call (0: any).
	Tile int
	// Budget bounds the work of one call as Cost counts it (0, or no Cost:
	// the whole layer in one call unless Tile cuts it). A call takes at
	// least one KDAChunk step of a sequence, whatever it costs.
	Budget float64
	// Cost is the work of layer over positions [lo, hi) of one sequence
	// (attention over the cache grows with the position).
	Cost func(layer, lo, hi int) float64
	// Between runs after every call but the layer's last, with the first
	// row not yet run and the layer's new partial sum when it starts an
	// AttnRes block (nil otherwise). It may drop sequences from the batch
	// (Model.DropSeq, with next as the extra tensor) and returns from in
	// the new layout.
	Between func(layer, from int, next *kernels.Tensor) int
	// After runs after each call with its rows (tests, logs).
	After func(layer, lo, hi int)
}

// DefaultCallFLOPs is a budget for Calls.Budget: about 0.05-0.15 s of the
// CPU backend on one core, so that a cancelled sequence leaves a layer well
// within a second.
const DefaultCallFLOPs = 1e9

// RunLayerInCalls applies layer l to the batch in calls cut by c (one call
// when c cuts nothing, or when the batch lives in device memory that cannot
// address a band of rows) and returns how many calls it made. Between calls
// c.Between may shrink the batch; the batch may end empty.
func (m *Model) RunLayerInCalls(ctx context.Context, l *Layer, b *Batch, phase Phase, c Calls) (int, error) {
	if _, devView := b.Partial.Dev.(kernels.RowsViewer); b.Partial.Data == nil && !devView {
		return 1, m.RunLayer(ctx, l, b, phase)
	}
	L := l.Index
	budget := c.Budget
	if c.Cost == nil || !(budget > 0) {
		budget = 0
	}
	cost := func(i, lo, hi int) float64 { return c.Cost(L, lo, hi) }
	d := m.Cfg.HiddenSize
	blockStart := m.Cfg.IsBlockStart(L)
	var next *kernels.Tensor // the new partial sum at a block start
	calls := 0
	for from := 0; from < b.Rows(); {
		if from > 0 && c.Between != nil {
			if from = c.Between(L, from, next); from >= b.Rows() {
				break
			}
		}
		lens, starts := make([]int, len(b.Spans)), make([]int, len(b.Spans))
		for i, sp := range b.Spans {
			lens[i], starts[i] = sp.Len(), b.Seqs[i].Tokens
		}
		lo, hi := from, b.Rows()
		if budget > 0 || c.Tile > 0 {
			lo, hi = NextCall(lens, starts, from, c.Tile, budget, cost)
		}
		if from == 0 && hi == b.Rows() {
			if c.After != nil {
				defer c.After(L, 0, hi)
			}
			return 1, m.RunLayer(ctx, l, b, phase) // one call: the whole batch
		}
		if blockStart && next == nil {
			next = m.Backend.NewTensor(b.Rows(), d)
		}
		sub := &Batch{Partial: b.Partial.RowsView(lo, hi), Stack: make([]*kernels.Tensor, len(b.Stack)), Attention: b.Attention}
		for j, t := range b.Stack {
			sub.Stack[j] = t.RowsView(lo, hi)
		}
		for i, sp := range b.Spans {
			if a, z := max(sp.Lo, lo), min(sp.Hi, hi); a < z {
				sub.Seqs = append(sub.Seqs, b.Seqs[i])
				sub.Spans = append(sub.Spans, kernels.Span{Lo: a - lo, Hi: z - lo})
			}
		}
		calls++
		if err := m.RunLayer(ctx, l, sub, phase); err != nil {
			if next != nil {
				m.Backend.Free(next)
			}
			return calls, err
		}
		if blockStart {
			m.Backend.CopyBlock(next, lo, 0, sub.Partial, 0, 0, hi-lo, d)
			m.Backend.Free(sub.Partial)
		}
		// Elsewhere the call's partial sum was updated in place in the view.
		if c.After != nil {
			c.After(L, lo, hi)
		}
		from = hi
	}
	if blockStart && next != nil {
		next.Truncate(b.Rows())
		b.Stack = append(b.Stack, b.Partial)
		b.Partial = next
	}
	return calls, nil
}

// DropSeq removes sequence i from the batch: its rows are squeezed out of
// the partial sum, every block of the stack and the extra tensors (of the
// batch's rows; nil ones are skipped) in place, without new memory, and the
// later sequences' spans move up. Its state keeps whatever the calls so far
// wrote into it: the caller throws it away.
func (m *Model) DropSeq(b *Batch, i int, extra ...*kernels.Tensor) {
	sp := b.Spans[i]
	n := sp.Len()
	squeeze := func(t *kernels.Tensor) {
		if t.Rows > sp.Hi {
			m.Backend.CopyBlock(t, sp.Lo, 0, t, sp.Hi, 0, t.Rows-sp.Hi, t.Cols)
		}
		t.Truncate(t.Rows - n)
	}
	squeeze(b.Partial)
	for _, t := range b.Stack {
		squeeze(t)
	}
	for _, t := range extra {
		if t != nil {
			squeeze(t)
		}
	}
	b.Seqs = append(b.Seqs[:i], b.Seqs[i+1:]...)
	b.Spans = append(b.Spans[:i], b.Spans[i+1:]...)
	for j := i; j < len(b.Spans); j++ {
		b.Spans[j].Lo -= n
		b.Spans[j].Hi -= n
	}
}

// NextCall is the next call of a layer whose cost per row depends on the
// row's position. The batch holds pieces of the given lengths back to back,
// piece i starting at prompt position starts[i], a multiple of KDAChunk.
// From batch row from, 0 or the end of an earlier call, NextCall returns the
// rows [lo, hi) of a call of at most tile rows whose cost stays within
// budget, where tile 0 and budget 0 mean any. The cost sums cost(piece, lo,
// hi) over the call's KDAChunk-row steps, lo and hi being prompt positions.
// A call always takes at least one step and cuts a piece only at multiples
// of KDAChunk from its start, so that each sequence's chunked KDA sees the
// chunks one call over the batch sees.
func NextCall(lens, starts []int, from, tile int, budget float64, cost func(piece, lo, hi int) float64) (lo, hi int) {
	if tile > 0 {
		tile = max(KDAChunk, tile-tile%KDAChunk)
	}
	off := 0
	acc, rows := 0.0, 0
	for i, n := range lens {
		if from >= off+n {
			off += n
			continue
		}
		for pos := max(from-off, 0); pos < n; {
			next := min(n, pos+KDAChunk-pos%KDAChunk)
			c := 0.0
			if budget > 0 {
				c = cost(i, starts[i]+pos, starts[i]+next)
			}
			if rows > 0 && ((tile > 0 && rows+next-pos > tile) || (budget > 0 && acc+c > budget)) {
				return from, off + pos
			}
			acc += c
			rows += next - pos
			pos = next
		}
		off += n
	}
	return from, off
}
