package pipeline

import (
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// onStep runs a step that came from the previous rank through this rank's
// layers, and sends it on: to the next rank, or, from the last rank, as
// sampled tokens back to rank 0. A step this rank cannot run fails its
// sequences (the report travels on to the head), not the ring.
func (w *Worker) onStep(m *mesh.Msg) {
	st := m.Step
	tr := st.Trace
	if len(tr.Compute) != w.n || len(tr.Mesh) != w.n {
		tr.Compute, tr.Mesh = make([]int64, w.n), make([]int64, w.n)
	}
	fail := func(err error) {
		if w.ctx.Err() != nil {
			return // closing: the ring's reset reports it
		}
		err = fmt.Errorf("decode rank %d: step %d: %w", w.cfg.Rank, st.ID, err)
		w.log.Warn("step failed", zap.Error(err))
		res := make([]mesh.Result, len(st.Seqs))
		for i, id := range st.Seqs {
			res[i] = mesh.Result{Seq: id, Done: true, Reason: string(ReasonError), Err: err.Error()}
			if s := w.seqs[id]; s != nil {
				w.free(s)
			}
		}
		w.send(&mesh.Header{Kind: mesh.KindTokens, Epoch: w.epoch, Tokens: &mesh.Tokens{Step: st.ID, Results: res, Trace: tr}}, nil)
	}
	phase := model.Phase(st.Phase)
	switch {
	case phase != model.PhasePrefill && phase != model.PhaseDecode:
		fail(fmt.Errorf("unknown phase %d", st.Phase))
		return
	case len(st.Seqs) == 0 || len(st.Pos) != len(st.Seqs) || len(st.Rows) != len(st.Seqs):
		fail(fmt.Errorf("%d sequences with %d positions and %d row counts", len(st.Seqs), len(st.Pos), len(st.Rows)))
		return
	case st.Cols != w.m.Cfg.HiddenSize || st.Stack != w.m.Cfg.StackLenBefore(w.lo):
		fail(fmt.Errorf("activations of width %d with %d blocks; layer %d takes width %d with %d", st.Cols, st.Stack, w.lo, w.m.Cfg.HiddenSize, w.m.Cfg.StackLenBefore(w.lo)))
		return
	}
	// Sequences being cancelled leave the step before it runs: a rank that
	// dropped one from an earlier step holds a torn state for it.
	ss := make([]*seq, 0, len(st.Seqs))
	states := make([]*model.SeqState, 0, len(st.Seqs))
	spans := make([]kernels.Span, 0, len(st.Seqs))
	var skip []kernels.Span // the skipped sequences' rows in the payload
	rows := 0
	for i, id := range st.Seqs {
		n := int(st.Rows[i])
		switch {
		case n < 1 || phase == model.PhaseDecode && n != 1:
			fail(fmt.Errorf("sequence %q has %d rows in a %s step", id, st.Rows[i], phaseName(phase)))
			return
		case w.cancels.has(id):
			skip = append(skip, kernels.Span{Lo: rows, Hi: rows + n})
			rows += n
			continue
		}
		s := w.seqs[id]
		switch {
		case s == nil || s.e.State == nil:
			fail(fmt.Errorf("sequence %q has no state on this rank", id))
			return
		case int(st.Pos[i]) != s.e.State.Tokens:
			fail(fmt.Errorf("sequence %q is at token %d here, the step is for token %d", id, s.e.State.Tokens, st.Pos[i]))
			return
		}
		ss, states = append(ss, s), append(states, s.e.State)
		spans = append(spans, kernels.Span{Lo: rows, Hi: rows + n})
		rows += n
	}
	t0 := time.Now()
	ts, err := mesh.DecodeTensors(w.m.Backend, m.Payload, 1+st.Stack, rows, st.Cols)
	if err != nil {
		fail(err)
		return
	}
	if tr.SentAt > 0 {
		tr.Mesh[w.cfg.Rank-1] += max(m.At.UnixNano()-tr.SentAt, 0)
	}
	tr.Mesh[w.cfg.Rank-1] += int64(time.Since(t0))

	t1 := time.Now()
	b := &model.Batch{Seqs: states, Spans: spans, Partial: ts[0], Stack: ts[1:]}
	if len(skip) > 0 {
		// Lay the skipped rows out as sequences of their own and drop them.
		all := &model.Batch{Partial: b.Partial, Stack: b.Stack}
		var drop []int
		for i, j := 0, 0; i < len(spans) || j < len(skip); {
			if j < len(skip) && (i == len(spans) || skip[j].Lo < spans[i].Lo) {
				drop = append(drop, len(all.Spans))
				all.Seqs, all.Spans = append(all.Seqs, nil), append(all.Spans, skip[j])
				j++
				continue
			}
			all.Seqs, all.Spans = append(all.Seqs, states[i]), append(all.Spans, spans[i])
			i++
		}
		for k := len(drop) - 1; k >= 0; k-- {
			w.m.DropSeq(all, drop[k])
		}
		b = all
	}
	var keep []bool
	if len(ss) > 0 {
		timeAttention(b, phase)
		keep, err = w.runLayers(b, ids(ss), phase)
		if err != nil {
			fail(err)
			return
		}
	}
	for i := len(ss) - 1; i >= 0; i-- {
		if !keep[i] {
			ss = slices.Delete(ss, i, i+1) // torn here: never stepped again, its Release follows
		}
	}
	w.addAttention(&tr, b, ss)
	if len(ss) == 0 {
		// Nothing is left to pass on: the head's step ends here, with no
		// results (it ended the sequences as cancelled).
		w.stepDone(st.ID, phase, 0, 0, time.Since(t1))
		w.send(&mesh.Header{Kind: mesh.KindTokens, Epoch: w.epoch, Tokens: &mesh.Tokens{Step: st.ID, Trace: tr}}, nil)
		return
	}
	b.Advance()
	if phase == model.PhasePrefill {
		for _, s := range ss {
			if s.pend != nil {
				w.cache.Snapshot(s.pend, s.e.State)
			}
		}
	}
	if w.last {
		results := w.sample(ss, phase, b)
		compute := time.Since(t1)
		tr.Compute[w.cfg.Rank] = int64(compute)
		for _, r := range results {
			if r.Done {
				// A sequence that leaves a cache entry waits for the
				// head's Release, as every other rank does, so that all
				// keep it at the same point of the ring's order.
				if s := w.seqs[r.Seq]; s != nil && (s.pend == nil || r.Reason == string(ReasonError)) {
					w.free(s)
				}
			}
		}
		w.stepDone(st.ID, phase, len(ss), rows, compute)
		w.send(&mesh.Header{Kind: mesh.KindTokens, Epoch: w.epoch, Tokens: &mesh.Tokens{Step: st.ID, Results: results, Trace: tr}}, nil)
		return
	}
	compute := time.Since(t1)
	tr.Compute[w.cfg.Rank] = int64(compute)
	w.stepDone(st.ID, phase, len(ss), rows, compute)
	t2 := time.Now()
	payload := mesh.EncodeTensors(w.m.Backend, nil, append([]*kernels.Tensor{b.Partial}, b.Stack...)...)
	tr.Mesh[w.cfg.Rank] += int64(time.Since(t2))
	next := *st
	next.Stack, next.Trace = len(b.Stack), tr
	if len(ss) < len(st.Seqs) {
		next.Seqs, next.Pos, next.Rows = nil, nil, nil
		for i, id := range st.Seqs {
			if slices.ContainsFunc(ss, func(s *seq) bool { return s.id == id }) {
				next.Seqs, next.Pos, next.Rows = append(next.Seqs, id), append(next.Pos, st.Pos[i]), append(next.Rows, st.Rows[i])
			}
		}
	}
	w.send(&mesh.Header{Kind: mesh.KindStep, Epoch: w.epoch, Step: &next}, payload)
}

// sample applies the final mix, norm and lm_head after a decode step and
// draws each sequence's next token, ending it on a stop token or at its
// token limit.
func (w *Worker) sample(ss []*seq, phase model.Phase, b *model.Batch) []mesh.Result {
	if phase != model.PhaseDecode {
		return nil
	}
	out := make([]mesh.Result, len(ss))
	logits, err := w.m.Logits(b)
	for i, s := range ss {
		r := &out[i]
		r.Seq = s.id
		if err != nil {
			r.Done, r.Reason, r.Err = true, string(ReasonError), fmt.Sprintf("decode rank %d: logits: %v", w.cfg.Rank, err)
			continue
		}
		var t0 time.Time
		if s.matcher != nil {
			t0 = time.Now()
		}
		tok, ended, serr := s.draw(logits[i])
		if s.matcher != nil {
			w.grammarDraws.Add(1)
			w.grammarNanos.Add(int64(time.Since(t0)))
		}
		if serr != nil {
			r.Done, r.Reason, r.Err = true, string(ReasonError), fmt.Sprintf("decode rank %d: %v", w.cfg.Rank, serr)
			continue
		}
		s.generated++
		r.Token = tok
		switch {
		case s.stop[tok] || ended:
			r.Done, r.Reason = true, string(ReasonStop)
		case s.generated >= s.admit.MaxTokens:
			r.Done, r.Reason = true, string(ReasonLength)
		}
	}
	return out
}

// draw samples the sequence's next token, within its grammar if it has
// one; ended reports the token that completes the grammar's reply.
func (s *seq) draw(logits []float32) (tok int32, ended bool, err error) {
	if s.matcher == nil {
		tok, err = s.sampler.Sample(logits)
		return tok, false, err
	}
	if err := s.matcher.Mask(s.mask); err != nil {
		return 0, false, err
	}
	if tok, err = s.sampler.SampleMasked(logits, s.mask); err != nil {
		return 0, false, err
	}
	if err := s.matcher.Accept(int(tok)); err != nil {
		return 0, false, err
	}
	return tok, s.matcher.Ended(), nil
}

// stepDone counts and logs a step this rank computed.
func (w *Worker) stepDone(id uint64, phase model.Phase, seqs, rows int, compute time.Duration) {
	w.counters.steps++
	w.counters.compute += compute
	if ce := w.log.Check(zap.DebugLevel, "step"); ce != nil {
		ce.Write(zap.Uint64("step", id), zap.String("phase", phaseName(phase)), zap.Int("seqs", seqs),
			zap.Int("rows", rows), zap.Duration("compute", compute))
	}
}

func phaseName(p model.Phase) string {
	switch p {
	case model.PhasePrefill:
		return "prefill"
	case model.PhaseDecode:
		return "decode"
	}
	return fmt.Sprintf("phase %d", p)
}
