package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
)

func (w *Worker) onEvent(ev mesh.Event) {
	if ev.Msg != nil {
		if ev.Msg.Kind == mesh.KindReset {
			w.onReset(ev.Msg, ev.Dir)
			return
		}
		w.onMsg(ev.Msg)
		return
	}
	if ev.Up {
		if ev.Dir == mesh.Downstream && w.head && !w.formed {
			w.sendForm()
		}
		return
	}
	w.linkDown(ev.Dir, ev.Err)
}

// linkDown resets the rank when one of its links dies. If the ring was
// formed, the rank sends a Reset naming the lost link on its other link, away
// from the failure; every rank passes it on in the direction it travels, so
// the two waves from both ends of the lost link reach every rank within
// moments, and each sequence's error names the link that failed. A rank
// already reset (or a Reset of an older ring) ends the wave.
func (w *Worker) linkDown(d mesh.Dir, cause error) {
	peer := peerOf(w.cfg.Rank, w.n, d)
	err := fmt.Errorf("decode rank %d lost its link to rank %d (%s): %w", w.cfg.Rank, peer, w.cfg.Layout.Ranks[peer].Endpoint, cause)
	if !w.formed {
		w.reset(err)
		return
	}
	w.log.Warn("ring broken", zap.Error(err))
	up, down := resetLinks(d)
	w.broadcastReset(err, up, down)
}

// broadcastReset resets the rank and sends a Reset of the current ring on
// the chosen links.
func (w *Worker) broadcastReset(err error, up, down bool) {
	h := &mesh.Header{Kind: mesh.KindReset, Epoch: w.epoch, Rank: w.cfg.Rank, Reason: err.Error()}
	w.reset(err)
	if up {
		_ = w.ring.SendUp(h, nil)
	}
	if down {
		_ = w.ring.Send(h, nil)
	}
}

// onReset: another rank lost a link; drop everything and pass it on.
func (w *Worker) onReset(m *mesh.Msg, from mesh.Dir) {
	if !w.formed || m.Epoch != w.epoch {
		return
	}
	w.log.Warn("ring reset by another rank", zap.Int("from_rank", m.Rank), zap.String("reason", m.Reason))
	up, down := passReset(from)
	w.broadcastReset(errors.New(m.Reason), up, down)
}

// reset drops every sequence (the head ends each with err) and unforms the
// ring. The head moves to a new epoch, so that nothing of the old ring is
// taken for the new one.
func (w *Worker) reset(err error) {
	for _, s := range w.seqs {
		w.drop(s, err)
	}
	w.queue, w.overflow = nil, nil
	for _, sl := range w.slots {
		sl.members, sl.inflight = nil, false
	}
	clear(w.flights)
	w.dropCollective() // the next ring's epoch connects the stage again
	if w.cache != nil {
		// A rank may have restarted with an empty cache: start again alike.
		w.cache.Clear()
	}
	if w.head {
		w.epoch++
	}
	if w.ring != nil || w.ctx.Err() != nil {
		w.setFormed(false)
	}
}

// drop removes a sequence after a failure of the group; the head tells its
// submitter or its sink.
func (w *Worker) drop(s *seq, err error) {
	w.free(s)
	if !w.head {
		return
	}
	w.counters.failed++
	if s.admitting {
		s.reply <- fmt.Errorf("%w: %w", ErrNotReady, err)
		return
	}
	w.finish(s, Result{Reason: ReasonError, Err: err})
}

func (w *Worker) onTick() {
	if w.ring == nil || !w.head {
		return
	}
	launched := make(map[uint64]time.Time, len(w.flights))
	for id, f := range w.flights {
		launched[id] = f.launched
	}
	switch act, id := onTickAction(w.formed, launched, w.now(), w.cfg.StepTimeout); act {
	case tickForm:
		w.sendForm()
	case tickReset:
		err := fmt.Errorf("decode group: step %d did not come back within %v", id, w.cfg.StepTimeout)
		w.log.Warn("ring stalled", zap.Error(err))
		up, down := resetLinks(0)
		w.broadcastReset(err, up, down)
	}
}

func (w *Worker) sendForm() {
	wait := !w.collReady(w.epoch)
	_ = w.ring.Send(&mesh.Header{Kind: mesh.KindForm, Epoch: w.epoch, Wait: wait}, nil) // retried on the next tick
}

// forward passes a message on to the next rank.
func (w *Worker) forward(m *mesh.Msg) {
	if err := w.ring.Send(&m.Header, m.Payload); err != nil {
		w.log.Debug("message not forwarded", zap.Stringer("kind", m.Kind), zap.Error(err))
	}
}

func (w *Worker) onMsg(m *mesh.Msg) {
	switch m.Kind {
	case mesh.KindForm:
		w.onForm(m)
		return
	case mesh.KindCancel: // of no epoch: the head sends it from outside its loop
		w.onCancelMsg(m)
		return
	}
	if m.Epoch != w.epoch {
		w.log.Debug("message of another ring dropped", zap.Stringer("kind", m.Kind), zap.Uint64("epoch", m.Epoch), zap.Uint64("current", w.epoch))
		return
	}
	switch m.Kind {
	case mesh.KindAdmit:
		if m.Admit == nil {
			w.protocolError(m, "admit without its body")
			return
		}
		if w.head {
			w.onAdmitted(m)
			return
		}
		if len(m.Admit.Verdicts) == 0 {
			if err := w.admitLocal(m.Seq, m.Admit); err != nil {
				m.Admit.Verdicts = append(m.Admit.Verdicts, w.verdict(err))
			}
		} else if w.cache != nil {
			for _, ev := range m.Admit.Evicted {
				w.cache.Drop(ev)
			}
		}
		w.forward(m)
	case mesh.KindRelease:
		if s := w.seqs[m.Seq]; s != nil {
			w.retire(s, m.Keep)
		}
		if !w.ringLast {
			w.forward(m)
		}
	case mesh.KindReady, mesh.KindFailed:
		if !w.head {
			w.forward(m)
			return
		}
		if m.Rank <= 0 || m.Rank >= w.n {
			w.protocolError(m, fmt.Sprintf("from rank %d", m.Rank))
			return
		}
		if s := w.seqs[m.Seq]; s != nil {
			if m.Kind == mesh.KindReady {
				w.stateReady(s, m.Rank)
			} else {
				w.stateFailed(s, m.Rank, m.Reason)
			}
		}
	case mesh.KindStep:
		if m.Step == nil || w.head {
			w.protocolError(m, "step where none can come")
			return
		}
		w.onStep(m)
	case mesh.KindTokens:
		if m.Tokens == nil {
			w.protocolError(m, "tokens without their body")
			return
		}
		if w.head {
			w.onTokens(m)
			return
		}
		w.forward(m) // a failure report from a rank before the last
	default:
		w.protocolError(m, "unknown kind")
	}
}

// protocolError resets the ring: a peer that breaks the protocol cannot be
// trusted with the sequences.
func (w *Worker) protocolError(m *mesh.Msg, what string) {
	err := fmt.Errorf("decode rank %d: bad %s message from the previous rank: %s", w.cfg.Rank, m.Kind, what)
	w.log.Error("protocol error", zap.Error(err))
	w.ring.DropUpstream(err)
}

// onForm: rank 0's Form goes around the ring; it forms the ring when it
// comes back. Another rank adopts the epoch, dropping what it held for an
// older ring.
func (w *Worker) onForm(m *mesh.Msg) {
	switch onFormAction(w.head, w.formed, m.Epoch, w.epoch, len(w.seqs)) {
	case formIgnore:
		return
	case formRingFormed:
		if m.Wait {
			return // a tensor stage is connecting: the next tick's Form tries again
		}
		w.setFormed(true)
		w.log.Info("ring formed", zap.Uint64("epoch", w.epoch), zap.Int("ranks", w.n))
		return
	case formJoinReset:
		w.reset(errors.New("the group formed a new ring"))
	}
	w.epoch = m.Epoch
	w.setFormed(true)
	if !w.collReady(m.Epoch) {
		m.Wait = true // the stage's links are connecting for this epoch
	}
	w.forward(m)
}

// admitLocal reserves a sequence on this rank: its state memory (cache
// entries evicted for it first, least recently used first), its transfer
// session (remote) or a state, empty or restored from the prefix cache
// (local), its planned cache entry, and on the last rank its sampler.
func (w *Worker) admitLocal(id string, a *mesh.Admit) error {
	if model.DType(a.LatentDType) != w.dtype {
		return fmt.Errorf("this rank keeps the MLA cache as %s, the group's head as %s", w.dtype, model.DType(a.LatentDType))
	}
	if a.Tokens < 1 || a.Cached < 0 || a.MaxTokens < 1 {
		return fmt.Errorf("admission of %d tokens (%d cached) for %d new ones", a.Tokens, a.Cached, a.MaxTokens)
	}
	pre := a.Prefix
	if pre == nil {
		pre = &mesh.Prefix{}
	}
	badRemote := a.Remote && (pre.At >= max(a.Cached, 1) || pre.Keep != 0 && !slices.Equal(pre.Snaps, []int{a.Cached}))
	if pre.At < 0 || pre.At%prefixcache.Block != 0 || (pre.Hit == 0) != (pre.At == 0) || badRemote {
		return fmt.Errorf("prefix cache decision %+v for a %s sequence", *pre, map[bool]string{true: "remote", false: "local"}[a.Remote])
	}
	if w.cache != nil {
		for _, ev := range a.Evicted {
			w.cache.Drop(ev) // a rank before this one made room with it
		}
	} else if pre.Hit != 0 {
		return fmt.Errorf("%w: this rank's prefix cache is off", prefixcache.ErrMissing)
	}
	s := &seq{id: id, admit: a, slot: -1}
	capacity := a.Cached + a.Tokens + a.MaxTokens
	if !a.Remote {
		s.from = pre.At // a remote state's base is part of a.Cached
		capacity += pre.At
	}
	if w.last {
		p := sampling.Params{Temperature: a.Sampling.Temperature, TopK: a.Sampling.TopK, TopP: a.Sampling.TopP, Seed: a.Sampling.Seed}
		var err error
		if s.sampler, err = sampling.New(p); err != nil {
			return err
		}
		s.stop = map[int32]bool{}
		for _, t := range a.Stop {
			s.stop[t] = true
		}
		if a.Grammar != nil {
			if w.cfg.Vocabulary == nil {
				return errors.New("a grammar needs the tokenizer's vocabulary on the last rank, and this rank has none")
			}
			g, err := w.grammars.Get(a.Grammar)
			if err != nil {
				return err
			}
			s.matcher, s.mask = g.NewMatcher(w.cfg.Vocabulary), make([]uint64, w.cfg.Vocabulary.MaskWords())
		}
	}
	e, err := w.reserve(id, capacity, pre.Hit, a)
	if err != nil {
		return err
	}
	s.e = e
	if a.Remote {
		if pre.Hit != 0 {
			// An append: the base's rows now, the rest with the transfer.
			w.table.Create(e)
			if err := w.cache.RestoreRows(e.State, pre.Hit, pre.At); err != nil {
				w.table.Free(id)
				return err
			}
		}
		if err := w.expect(s); err != nil {
			w.table.Free(id)
			return err
		}
		if pre.Keep != 0 && w.cache != nil {
			s.pend = &prefixcache.Pending{ID: pre.Keep, Plan: pre.Snaps, From: pre.Hit, FromPos: pre.At}
		}
	} else {
		w.table.Create(e)
		if pre.Hit != 0 {
			if err := w.cache.Restore(e.State, pre.Hit, pre.At); err != nil {
				w.table.Free(id)
				return err
			}
		}
		if pre.Keep != 0 && w.cache != nil {
			s.pend = &prefixcache.Pending{ID: pre.Keep, Plan: pre.Snaps, From: pre.Hit, FromPos: pre.At}
		}
	}
	w.seqs[id] = s
	w.log.Debug("sequence admitted", zap.String("seq", id), zap.Int("tokens", a.Tokens), zap.Int("cached", a.Cached),
		zap.Int("from_prefix_cache", pre.At), zap.Bool("remote", a.Remote), zap.Int64("reserved", e.Reserved))
	return nil
}

// reserve admits a sequence of capacity tokens to the table, evicting
// prefix-cache entries (never keep, the one it resumes from) while the
// budget is short; each eviction is listed in the Admit so that the ranks
// after this one and the head drop the entry too.
func (w *Worker) reserve(id string, capacity int, keep uint64, a *mesh.Admit) (*rank.Entry, error) {
	for {
		e, err := w.table.Admit(id, capacity)
		if err == nil || w.cache == nil || !errors.Is(err, rank.ErrNoMemory) {
			return e, err
		}
		victim, ok := w.cache.EvictOne(keep)
		if !ok {
			return nil, err
		}
		a.Evicted = append(a.Evicted, victim)
	}
}

// verdict is this rank's refusal of an admission.
func (w *Worker) verdict(err error) mesh.Verdict {
	return mesh.Verdict{Rank: w.cfg.Rank, Reason: err.Error(), Miss: errors.Is(err, prefixcache.ErrMissing)}
}

// free drops a sequence's state, reservation and pending transfer; a
// planned cache entry is given up.
func (w *Worker) free(s *seq) {
	if s.encoding != nil {
		s.encoding()
		s.encoding = nil
	}
	if s.in != nil {
		s.in.Cancel()
		s.in = nil
	}
	if s.pend != nil {
		w.cache.Abandon(s.pend)
		s.pend = nil
	}
	w.table.Free(s.id)
	if w.seqs[s.id] == s {
		delete(w.seqs, s.id)
		w.cancels.remove(s.id)
	}
	w.unschedule(s)
}

// retire frees a sequence that ended; when keep (it ended well, so every
// rank stepped it alike) its planned cache entry is kept, after its
// reservation is released so that the entry can take the room.
func (w *Worker) retire(s *seq, keep bool) {
	pend, st := s.pend, s.e.State
	s.pend = nil
	w.free(s)
	if pend == nil {
		return
	}
	if keep && st != nil {
		w.cache.Insert(pend, st, s.prompt())
		return
	}
	w.cache.Abandon(pend)
}

// expect registers this rank's transfer session for a remote sequence and
// waits for the commit in the background.
func (w *Worker) expect(s *seq) error {
	a := s.admit
	if w.cfg.Server == nil {
		return errors.New("this rank has no kvtransfer server for remote states")
	}
	if len(a.Sessions) != w.n {
		return fmt.Errorf("%d transfer sessions for %d ranks", len(a.Sessions), w.n)
	}
	layers := make([]int, 0, w.hi-w.lo)
	for L := w.lo; L < w.hi; L++ {
		layers = append(layers, L)
	}
	sess := a.Sessions[w.cfg.Rank]
	// A tensor rank receives its slice of each layer, and kvtransfer
	// refuses any other shape.
	spec := kvtransfer.ExpectSpec{Job: s.id, Session: sess.ID, Secret: sess.Secret,
		Model: w.m.Cfg, Layers: layers, Tokens: a.Cached, LatentDType: w.dtype, Shard: w.cfg.Layout.Shard(w.cfg.Rank),
		LatentCapacity: s.e.Capacity, Deadline: time.Unix(0, a.Deadline)}
	if pre := a.Prefix; pre != nil && pre.Hit != 0 {
		// An append to the rows restored at admission: only the rest
		// comes, and the sender must name the same base.
		spec.Base, spec.BaseKey, spec.LatentCapacity = pre.At, pre.Link, a.Cached-pre.At
	}
	in, err := w.cfg.Server.Expect(spec)
	if err != nil {
		return err
	}
	s.in = in
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		st, err := in.Wait(w.ctx)
		select {
		case w.commits <- commit{id: s.id, in: in, st: st, err: err}:
		case <-w.ctx.Done():
		}
	}()
	return nil
}

// commit is a transfer session's outcome.
type commit struct {
	id  string
	in  *kvtransfer.Incoming
	st  *model.SeqState
	err error
}

// onCommit installs a committed state after verifying it, and tells the
// head; a state that fails is refused before any decoding starts.
func (w *Worker) onCommit(c commit) {
	s := w.seqs[c.id]
	if s == nil || s.in != c.in {
		return // released meanwhile
	}
	s.in = nil
	err := c.err
	st := c.st
	if pre := s.admit.Prefix; err == nil && pre != nil && pre.Hit != 0 {
		st = appendState(s.e.State, c.st, w.lo, w.hi)
	}
	if err == nil {
		err = w.table.Install(s.e, st, s.admit.Cached)
	}
	if err == nil && s.pend != nil {
		w.cache.Snapshot(s.pend, s.e.State) // a remote state on the grid: the entry's snapshot
	}
	if err != nil {
		reason := fmt.Sprintf("state for layers [%d, %d) refused: %v", w.lo, w.hi, err)
		if sh := w.cfg.Layout.Shard(w.cfg.Rank); sh.Split() {
			reason = fmt.Sprintf("%s's slice of layers [%d, %d) refused: %v", sh, w.lo, w.hi, err)
		}
		w.log.Warn("remote state refused", zap.String("seq", s.id), zap.Error(err))
		if w.head {
			w.stateFailed(s, 0, reason)
			return
		}
		w.free(s)
		w.send(&mesh.Header{Kind: mesh.KindFailed, Epoch: w.epoch, Rank: w.cfg.Rank, Seq: s.id, Reason: reason}, nil)
		return
	}
	w.log.Debug("remote state committed", zap.String("seq", s.id), zap.Int("tokens", c.st.Tokens), zap.Int("bytes", c.st.Bytes()))
	if w.head {
		w.stateReady(s, 0)
		return
	}
	w.send(&mesh.Header{Kind: mesh.KindReady, Epoch: w.epoch, Rank: w.cfg.Rank, Seq: s.id}, nil)
}

// appendState completes base (the MLA rows restored from the prefix cache)
// with an append transfer's state: its MLA rows after them and its KDA
// states. The result is checked whole by the table's Install.
func appendState(base, delta *model.SeqState, lo, hi int) *model.SeqState {
	for L := lo; L < hi; L++ {
		d := delta.Layers[L]
		if d == nil {
			continue
		}
		if d.Kind != model.MLA {
			base.Layers[L] = d
			continue
		}
		bp, dp := &base.Layers[L].Parts[0], &d.Parts[0]
		bp.Data = append(bp.Data, dp.Data...)
		bp.Shape = []int{bp.Shape[0] + dp.Shape[0], bp.Shape[1]}
	}
	base.Tokens = delta.Tokens
	return base
}

// send sends a message of this rank's own to the next rank.
func (w *Worker) send(h *mesh.Header, payload []byte) {
	if err := w.ring.Send(h, payload); err != nil {
		w.log.Debug("message not sent", zap.Stringer("kind", h.Kind), zap.Error(err))
	}
}
