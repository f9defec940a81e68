package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/model"
)

// Submit admits a sequence: every rank reserves its state (and, for a
// remote one, expects its transfer session) or the sequence is refused with
// a *RefusedError naming the rank and the reason. Once admitted, its tokens
// and its end go to req.Sink. A remote sequence starts decoding when every
// rank has committed and verified its state; the caller starts the transfer
// after Submit returns. Only rank 0 takes submissions.
func (w *Worker) Submit(ctx context.Context, req Request) error {
	if !w.head {
		return fmt.Errorf("decode group: submit to rank 0 (the head); this is rank %d", w.cfg.Rank)
	}
	if err := req.validate(w.m.Cfg.VocabSize, w.n, w.m.Cfg.HiddenSize); err != nil {
		return err
	}
	if req.Grammar != nil {
		// A grammar that cannot compile is the request's fault: refuse it
		// here, before any rank reserves anything.
		if _, err := w.grammars.Get(req.Grammar); err != nil {
			return fmt.Errorf("decode group: sequence %q: %w", req.ID, err)
		}
	}
	req.Tokens = slices.Clone(req.Tokens)
	req.Stop = slices.Clone(req.Stop)
	req.Images = slices.Clone(req.Images)
	if req.Remote != nil {
		rm := *req.Remote
		rm.Sessions = slices.Clone(rm.Sessions)
		rm.Prompt = slices.Clone(rm.Prompt)
		req.Remote = &rm
	}
	reply := make(chan error, 1)
	if err := w.do(ctx, func() { w.headAdmit(&req, reply) }); err != nil {
		return err
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		// Forget the sequence, admitted or not, without calling its sink.
		_ = w.do(w.ctx, func() {
			if s := w.seqs[req.ID]; s != nil && s.reply == reply {
				w.free(s)
				w.release(s.id, false)
			}
		})
		return ctx.Err()
	}
}

// Cancel ends a sequence: its sink gets ReasonCancelled and every rank frees
// its state. It fails for a sequence the head does not hold. A step in
// progress drops the sequence between two calls of a layer (cancel.go), on
// whichever rank computes it; the cancellation goes on when ctx ends first.
func (w *Worker) Cancel(ctx context.Context, id string) error {
	if !w.head {
		return fmt.Errorf("decode group: cancel on rank 0 (the head); this is rank %d", w.cfg.Rank)
	}
	w.announceCancel(id)
	errc := make(chan error, 1)
	go func() {
		// On the worker's context, not the caller's: once announced, the
		// ranks drop the sequence from their steps, so it must end.
		if err := w.do(w.ctx, func() { errc <- w.cancelOnLoop(id) }); err != nil {
			errc <- err
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cancelOnLoop is Cancel's part on the loop.
func (w *Worker) cancelOnLoop(id string) error {
	s := w.seqs[id]
	_, ended := w.cancelEnded[id]
	switch onCancelAction(s != nil, s != nil && s.admitting, ended) {
	case cancelDone:
		delete(w.cancelEnded, id)
	case cancelUnknown:
		w.cancels.remove(id)
		return fmt.Errorf("decode group: no sequence %q", id)
	case cancelAdmitting:
		s.cancelled = true
	case cancelEnd:
		w.end(s, Result{Reason: ReasonCancelled})
	}
	return nil
}

// headAdmit starts an admission on the loop.
func (w *Worker) headAdmit(req *Request, reply chan error) {
	w.admitAs(req, reply, true, nil)
}

// admitAs starts an admission, with the prefix cache's decision unless
// useCache is false (a rank missed the entry the head chose, which every
// rank then drops: evicted).
func (w *Worker) admitAs(req *Request, reply chan error, useCache bool, evicted []uint64) {
	if !w.formed {
		reply <- fmt.Errorf("%w: the ring of %d ranks is not formed (a rank is down or still starting)", ErrNotReady, w.n)
		return
	}
	if w.seqs[req.ID] != nil {
		reply <- fmt.Errorf("decode group: sequence %q is already running", req.ID)
		return
	}
	a := &mesh.Admit{Tokens: len(req.Tokens), MaxTokens: req.MaxTokens, LatentDType: uint8(w.dtype),
		Sampling: mesh.Sampling{Temperature: req.Sampling.Temperature, TopK: req.Sampling.TopK, TopP: req.Sampling.TopP, Seed: req.Sampling.Seed},
		Stop:     req.Stop, Grammar: req.Grammar, Evicted: evicted}
	if rm := req.Remote; rm != nil {
		a.Remote, a.Cached, a.Deadline = true, rm.Tokens, rm.Deadline.UnixNano()
		for _, s := range rm.Sessions {
			a.Sessions = append(a.Sessions, mesh.Session{ID: s.ID, Secret: s.Secret})
		}
		if w.cache != nil && !w.cacheOff {
			a.Prefix = w.planRemote(rm, req.Images, useCache)
		}
	} else if w.cache != nil && !w.cacheOff {
		a.Prefix = w.plan(prefixkey.Fold(req.Tokens, keyImages(req.Images)), useCache)
		if a.Prefix != nil {
			a.Tokens -= a.Prefix.At
		}
	}
	if err := w.admitLocal(req.ID, a); err != nil {
		if useCache && errors.Is(err, prefixcache.ErrMissing) {
			w.admitAs(req, reply, false, nil)
			return
		}
		w.counters.refused++
		reply <- &RefusedError{Seq: req.ID, Rank: 0, Reason: err.Error()}
		return
	}
	s := w.seqs[req.ID]
	s.req, s.reply, s.admitting, s.retried = *req, reply, true, !useCache
	s.ready = make([]bool, w.n)
	if w.n == 1 {
		w.admitted(s, nil)
		return
	}
	// The Admit is the only copy the ring mutates; the head keeps its own.
	own := *a
	s.admit = &own
	if err := w.ring.Send(&mesh.Header{Kind: mesh.KindAdmit, Epoch: w.epoch, Seq: req.ID, Admit: a}, nil); err != nil {
		w.admitted(s, []mesh.Verdict{{Rank: 0, Reason: err.Error()}})
	}
}

// plan is the head's prefix-cache decision for a local prompt: the longest
// cached prefix it resumes from (none when !lookup), and the positions
// where its state is kept as a new entry. nil: neither.
func (w *Worker) plan(prompt []int32, lookup bool) *mesh.Prefix {
	end := len(prompt) - 1 // the last prompt token runs as a decode step
	var hit uint64
	var at int
	if lookup {
		hit, at = w.cache.Lookup(prompt, end)
	}
	p := &mesh.Prefix{Hit: hit, At: at, Snaps: prefixcache.Snapshots(at, end, w.cfg.PrefixCache.Stride)}
	if len(p.Snaps) > 0 {
		p.Keep = w.cache.NewID()
	}
	if p.Hit == 0 && p.Keep == 0 {
		return nil
	}
	return p
}

// planRemote is the head's prefix-cache decision for a remote state: the
// base its transfer appends to (the proposed one, if an entry holds its
// rows and lookup is allowed), and an entry kept of the state when it lies
// on the grid. nil: neither.
func (w *Worker) planRemote(rm *Remote, imgs []Image, lookup bool) *mesh.Prefix {
	if rm.Prompt == nil {
		return nil
	}
	p := &mesh.Prefix{}
	if lookup && rm.Append > 0 {
		key := prefixkey.Fold(rm.Prompt, keyImages(imgs))[:rm.Append]
		if id, link := w.cache.Holding(key); id != 0 {
			p.Hit, p.At, p.Link = id, rm.Append, uint64(link)
		}
	}
	if rm.Tokens > 0 && rm.Tokens%prefixcache.Block == 0 {
		p.Keep, p.Snaps = w.cache.NewID(), []int{rm.Tokens}
	}
	if p.Hit == 0 && p.Keep == 0 {
		return nil
	}
	return p
}

// prompt is the sequence's whole prompt, as far as the head knows it, as
// the prefix cache keys it (each image's run folded with its hash).
func (s *seq) prompt() []int32 {
	p := s.req.Tokens
	if rm := s.req.Remote; rm != nil && rm.Prompt != nil {
		p = append(slices.Clone(rm.Prompt), s.req.Tokens...)
	}
	return prefixkey.Fold(p, keyImages(s.req.Images))
}

// keyImages are the images as the prefix cache's keys see them.
func keyImages(imgs []Image) []prefixkey.Image {
	if len(imgs) == 0 {
		return nil
	}
	out := make([]prefixkey.Image, len(imgs))
	for i, im := range imgs {
		out[i] = prefixkey.Image{At: im.At, Len: im.Len, Hash: im.Hash}
	}
	return out
}

// onAdmitted: the Admit came back around the ring.
func (w *Worker) onAdmitted(m *mesh.Msg) {
	s := w.seqs[m.Seq]
	if s == nil || !s.admitting {
		return
	}
	if w.cache != nil {
		for _, ev := range m.Admit.Evicted {
			w.cache.Drop(ev) // a rank made room with it: no rank is to count on it
		}
	}
	w.admitted(s, m.Admit.Verdicts)
}

// admitted settles an admission: refused (every rank frees what it
// reserved) or admitted (local sequences are ready to step; remote ones wait
// for their state on every rank). A refusal because a rank lacked the
// chosen cache entry is retried once without the cache.
func (w *Worker) admitted(s *seq, verdicts []mesh.Verdict) {
	s.admitting = false
	if len(verdicts) > 0 {
		v := verdicts[0]
		w.free(s)
		w.release(s.id, false)
		if v.Miss && !s.retried {
			var gone []uint64
			if pre := s.admit.Prefix; pre != nil && w.cache != nil {
				w.cache.Drop(pre.Hit)
				gone = []uint64{pre.Hit}
			}
			w.log.Info("prefix cache entry missing on a rank; admitting again without it", zap.String("seq", s.id), zap.Int("missing_on_rank", v.Rank))
			w.admitAs(&s.req, s.reply, false, gone)
			if r := w.seqs[s.id]; r != nil && s.cancelled {
				r.cancelled = true
			}
			return
		}
		w.counters.refused++
		w.log.Info("sequence refused", zap.String("seq", s.id), zap.Int("by_rank", v.Rank), zap.String("reason", v.Reason))
		s.reply <- &RefusedError{Seq: s.id, Rank: v.Rank, Reason: v.Reason}
		return
	}
	w.counters.admitted++
	s.timing.Admitted = w.now()
	if rm := s.req.Remote; rm != nil && rm.Appended != nil {
		*rm.Appended = 0
		if pre := s.admit.Prefix; pre != nil {
			*rm.Appended = pre.At
		}
	}
	s.reply <- nil // kept: it also identifies the Submit call (see its abandon path)
	w.log.Info("sequence admitted", zap.String("seq", s.id), zap.Int("tokens", len(s.req.Tokens)),
		zap.Int("cached", s.admit.Cached), zap.Int("from_prefix_cache", s.from), zap.Bool("remote", s.admit.Remote), zap.Int("max_tokens", s.req.MaxTokens))
	switch {
	case s.cancelled:
		w.end(s, Result{Reason: ReasonCancelled})
	case s.failure != nil:
		w.end(s, Result{Reason: ReasonError, Err: s.failure})
	case startable(s.admit.Remote, s.nready, w.n):
		w.start(s)
	}
}

// stateReady: rank r holds its verified remote state.
func (w *Worker) stateReady(s *seq, r int) {
	if !s.ready[r] {
		s.ready[r] = true
		s.nready++
	}
	if !s.admitting && startable(true, s.nready, w.n) && s.failure == nil {
		w.start(s)
	}
}

// stateFailed: rank r refused or never got its state: the sequence ends
// before any decoding.
func (w *Worker) stateFailed(s *seq, r int, reason string) {
	err := fmt.Errorf("decode rank %d: %s", r, reason)
	if s.admitting {
		s.failure = err
		return
	}
	w.end(s, Result{Reason: ReasonError, Err: err})
}

// start schedules a sequence whose state is in place on every rank.
func (w *Worker) start(s *seq) {
	if s.timing.Ready.IsZero() {
		s.timing.Ready = w.now()
	}
	if w.encodeFirst(s) {
		return
	}
	t := s.req.Tokens[s.from:]
	s.pending, s.next = t[:len(t)-1], t[len(t)-1]
	if w.drafting(s) {
		s.hist = slices.Clone(s.prompt())
	}
	w.ready(s)
}

// end finishes a sequence on the head and releases it on every rank; one
// that ended well leaves its planned prefix-cache entry on every rank.
func (w *Worker) end(s *seq, r Result) {
	keep := r.Reason != ReasonError
	if keep {
		w.remember(s)
	}
	w.retire(s, keep)
	w.release(s.id, keep)
	w.counters.finished++
	if r.Reason == ReasonError {
		w.counters.failed++
	}
	w.finish(s, r)
}

// finish tells the sink.
func (w *Worker) finish(s *seq, r Result) {
	r.Tokens, r.Cached = s.emitted, s.from
	r.Steps, r.Drafted, r.Accepted = s.steps, s.drafted, s.accepted
	s.timing.Ended = w.now()
	r.Timing = s.timing
	fields := []zap.Field{zap.String("seq", s.id), zap.String("reason", string(r.Reason)), zap.Int("tokens", s.emitted)}
	if !s.timing.FirstToken.IsZero() && s.emitted > 1 {
		d := s.timing.Ended.Sub(s.timing.FirstToken).Seconds()
		fields = append(fields, zap.Duration("ttft", s.timing.FirstToken.Sub(s.timing.Admitted)),
			zap.Float64("tok_per_s", float64(s.emitted-1)/d))
	}
	if r.Err != nil {
		fields = append(fields, zap.Error(r.Err))
	}
	w.log.Info("sequence ended", fields...)
	s.req.Sink.End(s.id, r)
}

// release tells the other ranks to free a sequence, keeping its planned
// cache entry or not.
func (w *Worker) release(id string, keep bool) {
	if w.ring != nil {
		w.send(&mesh.Header{Kind: mesh.KindRelease, Epoch: w.epoch, Seq: id, Keep: keep}, nil)
	}
}

// onTokens: a step came back from the last rank.
func (w *Worker) onTokens(m *mesh.Msg) {
	tk := m.Tokens
	f := w.flights[tk.Step]
	if f == nil {
		return
	}
	delete(w.flights, tk.Step)
	tr := tk.Trace
	if len(tr.Mesh) == w.n {
		tr.Mesh[w.n-1] += hopTime(tr.SentAt, m.At)
	}
	w.onResults(f, tk.Results, tr)
}

// onResults hands a step's tokens to the sinks and queues the sequences for
// their next step.
func (w *Worker) onResults(f *flight, results []mesh.Result, tr mesh.Trace) {
	if f.phase == model.PhaseDecode {
		c := &w.counters
		c.decodeSteps++
		c.decodeRows += int64(len(f.seqs))
		c.largest = max(c.largest, len(f.seqs))
		c.stepTime += w.now().Sub(f.launched)
		var cost time.Duration
		for _, v := range tr.Compute {
			c.stepCompute += time.Duration(v)
			cost += time.Duration(v)
		}
		for _, v := range tr.Mesh {
			c.stepMesh += time.Duration(v)
			cost += time.Duration(v)
		}
		for _, v := range tr.Coll {
			c.stepColl += time.Duration(v)
		}
		rows := 0
		for _, n := range f.rows {
			rows += n
		}
		w.curve.observe(rows, cost)
	}
	if f.slot >= 0 {
		w.slots[f.slot].inflight = false
	}
	if f.phase == model.PhasePrefill {
		f.account(tr)
	}
	inStep := map[string]*seq{}
	for _, s := range f.seqs {
		inStep[s.id] = s
	}
	for _, r := range results {
		s := inStep[r.Seq]
		live := s != nil && w.seqs[r.Seq] == s // else ended meanwhile (cancelled)
		act := onResult(r, f.phase, live, live && s.inflight)
		switch act {
		case resultIgnore:
			continue
		case resultFail:
			w.end(s, Result{Reason: ReasonError, Err: errors.New(r.Err)})
			continue
		}
		s.inflight = false
		run, err := w.verified(s, r)
		if err != nil {
			w.end(s, Result{Reason: ReasonError, Err: err})
			continue
		}
		if s.emitted == 0 {
			s.timing.FirstToken = w.now()
		}
		for _, t := range run {
			s.emitted++
			w.counters.tokens++
			s.req.Sink.Token(s.id, s.emitted-1, t)
		}
		if act == resultEnd {
			w.end(s, Result{Reason: Reason(r.Reason)})
			continue
		}
		s.next = r.Token // it stays in its micro-batch for the next step
	}
	w.fillSlots()
}

func ids(ss []*seq) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.id
	}
	return out
}

func int32s(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}
