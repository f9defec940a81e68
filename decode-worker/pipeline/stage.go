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
// sequences (the report travels on to the head), not the ring. The
// decisions are step.go's; this is the compute and the sends.
func (w *Worker) onStep(m *mesh.Msg) {
	st := m.Step
	if w.tees() {
		w.teeStep(m) // the stage's next rank runs it with this one
	}
	tr := st.Trace
	if len(tr.Compute) != w.n || len(tr.Mesh) != w.n {
		tr.Compute, tr.Mesh = make([]int64, w.n), make([]int64, w.n)
	}
	fail := func(err error) {
		if w.ctx.Err() != nil {
			return // closing: the ring's reset reports it
		}
		if w.split() {
			w.breakStage(fmt.Errorf("decode rank %d: step %d: %w", w.cfg.Rank, st.ID, err))
			return
		}
		h, err := failStep(w.cfg.Rank, w.epoch, st, tr, err)
		w.log.Warn("step failed", zap.Error(err))
		for _, id := range st.Seqs {
			if s := w.seqs[id]; s != nil {
				w.free(s)
			}
		}
		w.send(h, nil)
	}
	phase := model.Phase(st.Phase)
	view := w.view()
	p := planStep(view, st, w.stepSeqs(st.Seqs))
	if p.err != nil {
		fail(p.err)
		return
	}
	ss := make([]*seq, len(p.run))
	states := make([]*model.SeqState, len(p.run))
	for k, i := range p.run {
		ss[k] = w.seqs[st.Seqs[i]]
		states[k] = ss[k].e.State
		if n := p.commit[k]; n > 0 {
			// The head kept n rows of the sequence's last (verify) step.
			if err := w.m.Commit(states[k], n); err != nil {
				fail(err)
				return
			}
		}
	}
	drafts := p.drafts
	t0 := w.now()
	ts, err := mesh.DecodeTensors(w.m.Backend, m.Payload, 1+st.Stack, p.rows, st.Cols)
	if err != nil {
		fail(err)
		return
	}
	tr.Mesh[w.cfg.Rank-1] += hopTime(tr.SentAt, m.At) + int64(w.now().Sub(t0))

	t1 := w.now()
	b := &model.Batch{Seqs: states, Spans: p.spans, Partial: ts[0], Stack: ts[1:]}
	if len(p.skip) > 0 {
		// Lay the skipped rows out as sequences of their own and drop them.
		spans, from := merged(p.spans, p.skip)
		all := &model.Batch{Partial: b.Partial, Stack: b.Stack, Spans: spans, Seqs: make([]*model.SeqState, len(spans))}
		for k, i := range from {
			if i >= 0 {
				all.Seqs[k] = states[i]
			}
		}
		for k := len(from) - 1; k >= 0; k-- {
			if from[k] < 0 {
				w.m.DropSeq(all, k)
			}
		}
		b = all
	}
	coll0 := w.collTime()
	if len(ss) > 0 {
		timeAttention(b, phase)
		keep, err := w.runLayers(b, ids(ss), phase)
		if err != nil {
			fail(err)
			return
		}
		ss, drafts = kept(ss, keep), kept(drafts, keep) // torn here: never stepped again, its Release follows
	}
	w.addAttention(&tr, b, ss)
	if len(ss) == 0 {
		// Nothing is left to pass on: the head's step ends here, with no
		// results (it ended the sequences as cancelled).
		w.stepDone(st.ID, phase, 0, 0, w.now().Sub(t1))
		if w.sends() {
			w.send(stepNext(view, w.epoch, st, tr, nil, 0, nil), nil)
		}
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
		results := w.sample(ss, phase, b, drafts)
		compute := w.now().Sub(t1)
		w.traceCompute(&tr, compute, coll0)
		for _, r := range results {
			if s := w.seqs[r.Seq]; s != nil && freeOnLast(r, s.pend != nil) {
				w.free(s)
			}
		}
		w.stepDone(st.ID, phase, len(ss), p.rows, compute)
		if w.sends() {
			w.send(stepNext(view, w.epoch, st, tr, ids(ss), len(b.Stack), results), nil)
		}
		return
	}
	compute := w.now().Sub(t1)
	w.traceCompute(&tr, compute, coll0)
	w.stepDone(st.ID, phase, len(ss), p.rows, compute)
	if !w.sends() {
		return
	}
	t2 := w.now()
	payload := mesh.EncodeTensors(w.m.Backend, nil, append([]*kernels.Tensor{b.Partial}, b.Stack...)...)
	tr.Mesh[w.cfg.Rank] += int64(w.now().Sub(t2))
	w.send(stepNext(view, w.epoch, st, tr, ids(ss), len(b.Stack), nil), payload)
}

// view is this rank's rankView.
func (w *Worker) view() rankView {
	return rankView{rank: w.cfg.Rank, lo: w.lo, cols: w.m.Cfg.HiddenSize, stack: w.m.Cfg.StackLenBefore(w.lo), last: w.last}
}

// stepSeqs is this rank's view of the sequences named ids.
func (w *Worker) stepSeqs(ids []string) map[string]seqView {
	out := make(map[string]seqView, len(ids))
	for _, id := range ids {
		// A split stage follows the step alone: its ranks may hear of a
		// cancel at different moments, and must cut the same rows.
		v := seqView{cancelled: !w.split() && w.cancels.has(id)}
		if s := w.seqs[id]; s != nil && s.e.State != nil {
			v.held, v.tokens, v.pending = true, s.e.State.Tokens, s.e.State.Pending()
		}
		out[id] = v
	}
	return out
}

// sample applies the final mix, norm and lm_head after a decode step and
// draws each sequence's next token, ending it on a stop token or at its
// token limit; a sequence with drafts (drafts[i], drafts may be nil) has
// them verified instead (verifyDraw).
func (w *Worker) sample(ss []*seq, phase model.Phase, b *model.Batch, drafts [][]int32) []mesh.Result {
	if phase != model.PhaseDecode {
		return nil
	}
	out := make([]mesh.Result, len(ss))
	var rows [][][]float32
	var logits [][]float32
	var err error
	if slices.ContainsFunc(drafts, func(d []int32) bool { return len(d) > 0 }) {
		rows, err = w.m.RowLogits(b)
	} else {
		logits, err = w.m.Logits(b)
	}
	for i, s := range ss {
		r := &out[i]
		r.Seq = s.id
		if err != nil {
			r.Done, r.Reason, r.Err = true, string(ReasonError), fmt.Sprintf("decode rank %d: logits: %v", w.cfg.Rank, err)
			continue
		}
		if rows != nil && len(drafts[i]) > 0 {
			w.verifyDraw(s, r, rows[i], drafts[i])
			continue
		}
		var l []float32
		if rows != nil {
			l = rows[i][0]
		} else {
			l = logits[i]
		}
		var t0 time.Time
		if s.matcher != nil {
			t0 = w.now()
		}
		tok, ended, serr := s.draw(l)
		if s.matcher != nil {
			w.grammarDraws.Add(1)
			w.grammarNanos.Add(int64(w.now().Sub(t0)))
		}
		if serr != nil {
			r.Done, r.Reason, r.Err = true, string(ReasonError), fmt.Sprintf("decode rank %d: %v", w.cfg.Rank, serr)
			continue
		}
		s.generated++
		r.Token = tok
		if why := sampledEnd(s.stop[tok], ended, s.generated, s.admit.MaxTokens); why != "" {
			r.Done, r.Reason = true, string(why)
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
