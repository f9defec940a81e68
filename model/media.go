package model

import (
	"context"
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
)

// An image enters K3 as rows of projected vision features that replace the
// embeddings of its pad run: the prompt holds one <|media_pad|> id per
// feature row, and the trunk, being NoPE, needs nothing else (spec §5.5).

// Media is one run of feature rows at its place in a sequence's tokens:
// Rows [n, HiddenSize] (row-major) replace the embedded rows of positions
// [At, At+n). Positions count from the first token the call is given.
type Media struct {
	At   int
	Rows []float32
}

// Len is the number of positions the rows cover for hidden width d.
func (md Media) Len(d int) int { return len(md.Rows) / d }

// MediaWindow is the part of media that falls in positions [lo, hi),
// shifted so that lo is position 0: what one chunk of a prompt needs when a
// chunk boundary cuts an image's run (the rows are per position, so the
// run is cut with them). The rows are shared, not copied.
func MediaWindow(media []Media, lo, hi, d int) []Media {
	var out []Media
	for _, md := range media {
		a, b := max(md.At, lo), min(md.At+md.Len(d), hi)
		if a >= b {
			continue
		}
		out = append(out, Media{At: a - lo, Rows: md.Rows[(a-md.At)*d : (b-md.At)*d]})
	}
	return out
}

// PadRuns returns the runs of pad in tokens, in order: the i-th run holds
// the i-th image's rows.
func PadRuns(tokens []int32, pad int32) []kernels.Span {
	var runs []kernels.Span
	for i := 0; i < len(tokens); i++ {
		if tokens[i] != pad {
			continue
		}
		j := i + 1
		for j < len(tokens) && tokens[j] == pad {
			j++
		}
		runs = append(runs, kernels.Span{Lo: i, Hi: j})
		i = j
	}
	return runs
}

// checkMedia checks that media fit a sequence of n positions of width d:
// whole rows, in order, not overlapping, inside [0, n).
func checkMedia(media []Media, n, d int) error {
	end := 0
	for k, md := range media {
		switch {
		case len(md.Rows) == 0 || len(md.Rows)%d != 0:
			return fmt.Errorf("media %d has %d values, not a positive multiple of the hidden size %d", k, len(md.Rows), d)
		case md.At < end:
			return fmt.Errorf("media %d starts at position %d, inside or before the previous one (which ends at %d)", k, md.At, end)
		case md.At+md.Len(d) > n:
			return fmt.Errorf("media %d covers positions [%d, %d), past the sequence's %d tokens", k, md.At, md.At+md.Len(d), n)
		}
		end = md.At + md.Len(d)
	}
	return nil
}

// NewBatchMedia is NewBatch with media[i] replacing rows of sequence i's
// embedding (nil media, or a nil entry, replaces none: the text path costs
// nothing more). The features cross to the backend with Upload, like any
// host values.
func (m *Model) NewBatchMedia(seqs []*SeqState, tokens [][]int32, media [][]Media) (*Batch, error) {
	if media != nil && len(media) != len(tokens) {
		return nil, fmt.Errorf("model: %d media lists for %d sequences", len(media), len(tokens))
	}
	d := m.Cfg.HiddenSize
	for i, md := range media {
		if err := checkMedia(md, len(tokens[i]), d); err != nil {
			return nil, fmt.Errorf("model: sequence %d: %w", i, err)
		}
	}
	b, err := m.NewBatch(seqs, tokens)
	if err != nil {
		return nil, err
	}
	for i, md := range media {
		m.overrideRows(b.Partial, b.Spans[i].Lo, md)
	}
	return b, nil
}

// OverrideRows replaces rows of x (embedded rows, [rows, HiddenSize]) with
// media, whose positions count from row base. The caller has checked the
// media (CheckMedia).
func (m *Model) OverrideRows(x *kernels.Tensor, base int, media []Media) {
	m.overrideRows(x, base, media)
}

// CheckMedia checks that media fit a sequence of n tokens: whole rows of
// the hidden width, in order, not overlapping, inside the tokens.
func (m *Model) CheckMedia(media []Media, n int) error {
	return checkMedia(media, n, m.Cfg.HiddenSize)
}

func (m *Model) overrideRows(x *kernels.Tensor, base int, media []Media) {
	be, d := m.Backend, m.Cfg.HiddenSize
	for _, md := range media {
		n := md.Len(d)
		t := be.NewTensor(n, d)
		be.Upload(t, md.Rows)
		be.CopyBlock(x, base+md.At, 0, t, 0, 0, n, d)
		be.Free(t)
	}
}

// PrefillStateMedia is PrefillState of one sequence with media replacing
// rows of its embedding.
func (m *Model) PrefillStateMedia(ctx context.Context, s *SeqState, tokens []int32, media []Media) error {
	b, err := m.NewBatchMedia([]*SeqState{s}, [][]int32{tokens}, [][]Media{media})
	if err != nil {
		return err
	}
	defer m.FreeBatch(b)
	if err := m.ForwardLayers(ctx, 0, m.Cfg.NumLayers, b, PhasePrefill); err != nil {
		return err
	}
	b.Advance()
	return nil
}

// StartMedia is Start for a prompt with images: media (positions in
// prompt) replace rows of prompt[:-1]'s embedding. The last prompt token
// runs as a decode step from its own embedding, so it must not be a
// feature row.
func (m *Model) StartMedia(ctx context.Context, prompt []int32, media []Media) (*SeqState, []float32, error) {
	if len(prompt) == 0 {
		return nil, nil, fmt.Errorf("model: empty prompt")
	}
	if err := m.CheckMedia(media, len(prompt)-1); err != nil {
		return nil, nil, fmt.Errorf("model: %w (the last prompt token runs as a decode step and cannot be an image's)", err)
	}
	s := m.NewState(0, m.Cfg.NumLayers)
	if len(prompt) > 1 {
		if err := m.PrefillStateMedia(ctx, s, prompt[:len(prompt)-1], media); err != nil {
			return nil, nil, err
		}
	}
	logits, err := m.Decode(ctx, []*SeqState{s}, prompt[len(prompt)-1:])
	if err != nil {
		return nil, nil, err
	}
	return s, logits[0], nil
}

// GenerateMedia is Generate for a prompt with images (StartMedia, then one
// greedy decode step per token): the monolithic reference that both
// disaggregated paths reproduce for image prompts.
func (m *Model) GenerateMedia(ctx context.Context, prompt []int32, media []Media, n int) ([]int32, error) {
	s, logits, err := m.StartMedia(ctx, prompt, media)
	if err != nil {
		return nil, err
	}
	out := make([]int32, 0, n)
	for len(out) < n {
		next := int32(Argmax(logits))
		out = append(out, next)
		if len(out) == n {
			break
		}
		l, err := m.Decode(ctx, []*SeqState{s}, []int32{next})
		if err != nil {
			return nil, err
		}
		logits = l[0]
	}
	return out, nil
}
