package model

import (
	"fmt"
	"time"

	"github.com/tandem-inference/tandem/kernels"
)

// Phase selects the form of the sequence ops. Prefill uses the chunked KDA
// and the expanded MLA; Decode the recurrent KDA and the weight-absorbed MLA
// (spec §3.3, §3.4). Both compute the same function; the phase only picks
// the cheaper form, and every path that must agree bit for bit (batched or
// streamed passes, super-chunks) uses the same phase.
type Phase uint8

const (
	PhasePrefill Phase = iota + 1
	PhaseDecode
)

// KDAChunk is the chunk size of the chunked KDA in prefill (fla uses 64). A
// prompt split into super-chunks at multiples of it gives bit-identical state.
const KDAChunk = 64

// Batch is the activations of several sequences between two layers: each
// sequence's rows, concatenated in order, for the AttnRes partial sum and
// the completed block stack (spec §3.2). It is what a decode rank hands to
// the next rank and what the prefill worker carries from layer to layer.
type Batch struct {
	Seqs    []*SeqState
	Spans   []kernels.Span
	Partial *kernels.Tensor   // [rows, d]
	Stack   []*kernels.Tensor // completed blocks, each [rows, d]

	// Attention, when not nil, adds up each sequence's time in the MLA
	// attention, the one op whose cost grows with the context, so that a
	// worker fits its rate apart from the rest (a prompt's whole time
	// cannot tell the two apart until the attention dominates it). Only
	// a backend whose ops run in the call is timed (not a device one).
	Attention map[*SeqState]time.Duration
}

// Rows is the number of token rows in the batch.
func (b *Batch) Rows() int {
	if len(b.Spans) == 0 {
		return 0
	}
	return b.Spans[len(b.Spans)-1].Hi
}

// spansFor lays out n sequences of the given lengths back to back.
func spansFor(lens []int) []kernels.Span {
	spans := make([]kernels.Span, len(lens))
	off := 0
	for i, n := range lens {
		spans[i] = kernels.Span{Lo: off, Hi: off + n}
		off += n
	}
	return spans
}

// NewBatch embeds tokens[i] for sequence seqs[i] (the rank that holds the
// embedding does this). Sequences with no tokens are not allowed.
func (m *Model) NewBatch(seqs []*SeqState, tokens [][]int32) (*Batch, error) {
	if len(seqs) != len(tokens) {
		return nil, fmt.Errorf("model: %d sequences but %d token lists", len(seqs), len(tokens))
	}
	if m.Globals == nil || m.Globals.Embed == nil {
		return nil, fmt.Errorf("model: embedding is not loaded on this holder")
	}
	lens := make([]int, len(tokens))
	var ids []int32
	for i, t := range tokens {
		if len(t) == 0 {
			return nil, fmt.Errorf("model: sequence %d has no tokens", i)
		}
		for _, id := range t {
			if id < 0 || int(id) >= m.Cfg.VocabSize {
				return nil, fmt.Errorf("model: token id %d of sequence %d is outside the vocabulary [0, %d)", id, i, m.Cfg.VocabSize)
			}
		}
		lens[i] = len(t)
		ids = append(ids, t...)
	}
	b := &Batch{Seqs: seqs, Spans: spansFor(lens)}
	b.Partial = m.Backend.NewTensor(len(ids), m.Cfg.HiddenSize)
	m.Backend.Embed(b.Partial, m.Globals.Embed, ids)
	return b, nil
}

// Advance records that every sequence consumed its rows (after the last
// layer this holder runs); a sequence with a verify step pending waits for
// Model.Commit instead.
func (b *Batch) Advance() {
	for i, s := range b.Seqs {
		if s.verify == nil {
			s.Tokens += b.Spans[i].Len()
		}
	}
}
