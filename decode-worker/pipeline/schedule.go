package pipeline

import (
	"fmt"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// The head keeps decoding sequences in MicroBatches slots. A slot's members
// are stepped together; while one slot's step goes through the ranks the
// others' steps follow it, so with as many slots as ranks every rank has
// work. A sequence joins the smallest slot when it is ready to decode (and
// waits if every slot holds MaxBatch), stays in it until it ends, and a slot
// steps again as soon as its tokens are back, so steps stay as large as the
// sequences allow instead of fragmenting. Prompt chunks to prefill go in
// their own steps, up to MicroBatches of them in flight.

// slot is one micro-batch of decoding sequences.
type slot struct {
	members  []*seq
	inflight bool
}

// flight is a step in flight from the head.
type flight struct {
	seqs     []*seq
	phase    model.Phase
	slot     int // -1 for a prefill step
	launched time.Time
	rows     []int // a prefill step's prompt rows, by sequence
}

// ready files a sequence whose state is in place: for prefill while prompt
// tokens are left, else into a decode slot.
func (w *Worker) ready(s *seq) {
	if len(s.pending) > 0 {
		w.queue = append(w.queue, s)
		return
	}
	s.slot = -1
	w.overflow = append(w.overflow, s)
	w.fillSlots()
}

// fillSlots moves waiting sequences into the smallest slots with room.
func (w *Worker) fillSlots() {
	sizes := make([]int, len(w.slots))
	for len(w.overflow) > 0 {
		for k, sl := range w.slots {
			sizes[k] = len(sl.members)
		}
		best := pickSlot(sizes, w.cfg.MaxBatch)
		if best < 0 {
			return
		}
		s := w.overflow[0]
		w.overflow = w.overflow[1:]
		s.slot = best
		w.slots[best].members = append(w.slots[best].members, s)
	}
}

// unschedule removes a sequence from the queue, the overflow or its slot.
func (w *Worker) unschedule(s *seq) {
	if i := slices.Index(w.queue, s); i >= 0 {
		w.queue = slices.Delete(w.queue, i, i+1)
	}
	if i := slices.Index(w.overflow, s); i >= 0 {
		w.overflow = slices.Delete(w.overflow, i, i+1)
	}
	if s.slot >= 0 && s.slot < len(w.slots) {
		sl := w.slots[s.slot]
		if i := slices.Index(sl.members, s); i >= 0 {
			sl.members = slices.Delete(sl.members, i, i+1)
		}
		s.slot = -1
	}
}

func (w *Worker) prefillFlights() int {
	n := 0
	for _, f := range w.flights {
		if f.slot < 0 {
			n++
		}
	}
	return n
}

// runnable reports whether the head can launch a step now.
func (w *Worker) runnable() bool {
	if !w.head || !w.formed {
		return false
	}
	return prefillDue(len(w.queue), w.prefillFlights(), w.maxSteps) ||
		slices.ContainsFunc(w.slots, func(sl *slot) bool { return slotDue(sl.inflight, len(sl.members)) })
}

// schedule launches what can go: one prefill step, then every idle slot.
func (w *Worker) schedule() {
	if !w.runnable() {
		return
	}
	if prefillDue(len(w.queue), w.prefillFlights(), w.maxSteps) {
		w.launchPrefill()
	}
	for k, sl := range w.slots {
		if slotDue(sl.inflight, len(sl.members)) {
			w.launch(slices.Clone(sl.members), nil, model.PhaseDecode, k)
		}
	}
}

// launchPrefill takes prompt chunks from the queue, in order, up to
// PrefillChunk rows.
func (w *Worker) launchPrefill() {
	pending, pos, stops := make([]int, len(w.queue)), make([]int, len(w.queue)), make([]int, len(w.queue))
	for i, s := range w.queue {
		pending[i], pos[i] = len(s.pending), s.e.State.Tokens
		if s.pend != nil {
			stops[i] = prefixcache.NextStop(s.pend.Plan, pos[i])
		}
	}
	rows := prefillRows(pending, pos, stops, w.cfg.PrefillChunk)
	if len(rows) == 0 {
		return
	}
	ss := slices.Clone(w.queue[:len(rows)])
	w.queue = slices.DeleteFunc(w.queue, func(s *seq) bool { return slices.Contains(ss, s) })
	w.launch(ss, rows, model.PhasePrefill, -1)
}

// launch runs a step through rank 0's layers and sends it on (or, in a
// group of one, runs it to the end). Sequences being cancelled do not
// start it, and leave it between two calls of a layer if their cancel
// comes while it computes: the head ends them at once, as cancelled.
func (w *Worker) launch(ss []*seq, rows []int, phase model.Phase, k int) {
	if rows == nil {
		rows = make([]int, len(ss))
	}
	for i := 0; i < len(ss); {
		if s := ss[i]; w.cancels.has(s.id) {
			w.endDropped(s)
			ss, rows = slices.Delete(ss, i, i+1), slices.Delete(rows, i, i+1)
			continue
		}
		i++
	}
	if len(ss) == 0 {
		return
	}
	id := w.nextStep
	w.nextStep++
	var drafts [][]int32
	if phase == model.PhaseDecode {
		drafts = w.planDrafts(ss)
	}
	states := make([]*model.SeqState, len(ss))
	toks := make([][]int32, len(ss))
	pos := make([]int32, len(ss))
	for i, s := range ss {
		states[i], pos[i] = s.e.State, int32(s.e.State.Tokens)
		if phase == model.PhasePrefill {
			toks[i] = s.pending[:rows[i]]
		} else {
			toks[i], rows[i] = append([]int32{s.next}, drafts[i]...), 1+len(drafts[i])
			s.inflight = true
		}
	}
	if k >= 0 {
		w.slots[k].inflight = true
	}
	t0 := w.now()
	var media [][]model.Media
	if phase == model.PhasePrefill {
		media = stepMedia(ss, pos, rows, w.m.Cfg.HiddenSize)
	}
	b, err := w.m.NewBatchMedia(states, toks, media)
	st := &mesh.Step{ID: id, Phase: uint8(phase), Seqs: ids(ss), Pos: pos, Rows: int32s(rows),
		Cols: w.m.Cfg.HiddenSize, Draft: slices.Concat(drafts...)}
	if err == nil && w.tees() {
		// The stage's other ranks take the step's input as it is now.
		in := *st
		in.Stack, in.Trace = len(b.Stack), mesh.Trace{Compute: make([]int64, w.n), Mesh: make([]int64, w.n)}
		payload := mesh.EncodeTensors(w.m.Backend, nil, append([]*kernels.Tensor{b.Partial}, b.Stack...)...)
		w.send(&mesh.Header{Kind: mesh.KindStep, Epoch: w.epoch, Step: &in}, payload)
	}
	coll0 := w.collTime()
	var keep []bool
	if err == nil {
		timeAttention(b, phase)
		keep, err = w.runLayers(b, ids(ss), phase)
	}
	if err == nil && w.split() && w.last && phase == model.PhaseDecode {
		// A stage of one both first and last: the head takes part in the
		// gathering of the logits; the group's last rank draws the tokens.
		err = w.gatherOnly(b, drafts)
	}
	if err != nil {
		if k >= 0 {
			w.slots[k].inflight = false
		}
		if w.ctx.Err() != nil {
			return // closing: shutdown ends the sequences
		}
		if w.split() {
			w.breakStage(fmt.Errorf("decode rank 0: step %d: %w", id, err))
			return
		}
		for _, s := range ss {
			w.end(s, Result{Reason: ReasonError, Err: fmt.Errorf("decode rank 0: step %d: %w", id, err)})
		}
		return
	}
	b.Advance()
	for i := len(ss) - 1; i >= 0; i-- {
		if !keep[i] {
			w.endDropped(ss[i])
			ss, rows, pos = slices.Delete(ss, i, i+1), slices.Delete(rows, i, i+1), slices.Delete(pos, i, i+1)
			if drafts != nil {
				drafts = slices.Delete(drafts, i, i+1)
			}
		}
	}
	if len(ss) == 0 {
		if k >= 0 {
			w.slots[k].inflight = false
		}
		w.stepDone(id, phase, 0, 0, w.now().Sub(t0))
		return
	}
	if phase == model.PhasePrefill {
		for i, s := range ss {
			if s.pend != nil {
				w.cache.Snapshot(s.pend, s.e.State)
			}
			// The next chunk, or the last prompt token's decode step, can
			// follow at once: every rank runs a sequence's steps in order.
			s.pending = s.pending[rows[i]:]
			w.ready(s)
		}
	}
	f := &flight{seqs: ss, phase: phase, slot: k, launched: t0, rows: rows}
	tr := mesh.Trace{Compute: make([]int64, w.n), Mesh: make([]int64, w.n)}
	w.addAttention(&tr, b, ss)
	if w.n == 1 { // a group of one
		results := w.sample(ss, phase, b, drafts)
		compute := w.now().Sub(t0)
		tr.Compute[0] = int64(compute)
		w.stepDone(id, phase, len(ss), b.Rows(), compute)
		w.onResults(f, results, tr)
		return
	}
	compute := w.now().Sub(t0)
	w.traceCompute(&tr, compute, coll0)
	w.stepDone(id, phase, len(ss), b.Rows(), compute)
	w.flights[id] = f
	if !w.sends() {
		return // the stage's last rank sends the output on
	}
	t1 := w.now()
	payload := mesh.EncodeTensors(w.m.Backend, nil, append([]*kernels.Tensor{b.Partial}, b.Stack...)...)
	tr.Mesh[0] = int64(w.now().Sub(t1))
	if len(ss) < len(st.Seqs) {
		st = &mesh.Step{ID: id, Phase: uint8(phase), Seqs: ids(ss), Pos: pos, Rows: int32s(rows),
			Cols: w.m.Cfg.HiddenSize, Draft: slices.Concat(drafts...)}
	}
	st.Stack, st.Trace = len(b.Stack), tr
	w.send(&mesh.Header{Kind: mesh.KindStep, Epoch: w.epoch, Step: st}, payload)
}

// endDropped ends, as cancelled, a sequence the head dropped from a step
// (or kept from starting one) because it is being cancelled; Cancel's own
// turn on the loop then finds it ended (cancelEnded).
func (w *Worker) endDropped(s *seq) {
	if w.seqs[s.id] != s {
		return
	}
	w.cancelEnded[s.id] = struct{}{}
	w.end(s, Result{Reason: ReasonCancelled})
}
