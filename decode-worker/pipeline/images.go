package pipeline

import (
	"context"
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// A prompt's images enter the group's own prefill as feature rows that
// replace their pad runs' embeddings on the head (the rank that embeds).
// The rows come with the request or from its Encode, which runs the vision
// tower once per sequence, off the loop (on it for a device backend),
// between admission and the first prefill step; the sequence waits for it
// as a remote one waits for its state.

// encodeFirst starts the sequence's Encode when an image the group is to
// prefill has no rows yet, and reports whether the sequence must wait for
// it (encoded then starts it, or ends it with the tower's error).
func (w *Worker) encodeFirst(s *seq) bool {
	from := s.e.State.Tokens // the first position the group prefills
	missing := -1
	for i, im := range s.req.Images {
		if im.At+im.Len > from && im.Rows == nil {
			missing = i
			break
		}
	}
	if missing < 0 {
		return false
	}
	enc := s.req.Encode
	if enc == nil {
		w.end(s, Result{Reason: ReasonError, Err: fmt.Errorf("decode group: sequence %q: image %d has no feature rows, and this group has no vision tower to compute them", s.id, missing)})
		return true
	}
	ctx, cancel := context.WithCancel(w.ctx)
	s.encoding = cancel
	if _, device := w.m.Backend.(kernels.DeviceMemory); device {
		// A device's ops must come from one goroutine at a time: the
		// tower runs on the loop, and the group's steps wait for it.
		rows, err := enc(ctx)
		w.encoded(s, rows, err)
		return true
	}
	go func() {
		rows, err := enc(ctx)
		_ = w.do(w.ctx, func() { w.encoded(s, rows, err) })
	}()
	return true
}

// encoded: the sequence's Encode returned.
func (w *Worker) encoded(s *seq, rows [][]float32, err error) {
	if w.seqs[s.id] != s || s.encoding == nil {
		return // it ended meanwhile (cancelled)
	}
	s.encoding()
	s.encoding = nil
	d := w.m.Cfg.HiddenSize
	if err == nil && len(rows) != len(s.req.Images) {
		err = fmt.Errorf("%d row sets for %d images", len(rows), len(s.req.Images))
	}
	for i := 0; err == nil && i < len(rows); i++ {
		if im := s.req.Images[i]; len(rows[i]) != im.Len*d {
			err = fmt.Errorf("image %d: %d feature values for a run of %d rows of %d", i, len(rows[i]), im.Len, d)
		}
	}
	if err != nil {
		w.end(s, Result{Reason: ReasonError, Err: fmt.Errorf("decode group: sequence %q: image features: %w", s.id, err)})
		return
	}
	for i := range rows {
		s.req.Images[i].Rows = rows[i]
	}
	w.start(s)
}

// media is the sequence's feature rows for its prompt positions
// [lo, lo+n), counted from the step's first token.
func (s *seq) media(lo, n, d int) []model.Media {
	if len(s.req.Images) == 0 {
		return nil
	}
	all := make([]model.Media, 0, len(s.req.Images))
	for _, im := range s.req.Images {
		if im.Rows != nil {
			all = append(all, model.Media{At: im.At, Rows: im.Rows})
		}
	}
	return model.MediaWindow(all, lo, lo+n, d)
}

// stepMedia is a prefill step's media by sequence (nil when none has any:
// the text path as it was).
func stepMedia(ss []*seq, pos []int32, rows []int, d int) [][]model.Media {
	var out [][]model.Media
	for i, s := range ss {
		md := s.media(int(pos[i]), rows[i], d)
		if md == nil {
			continue
		}
		if out == nil {
			out = make([][]model.Media, len(ss))
		}
		out[i] = md
	}
	return out
}
