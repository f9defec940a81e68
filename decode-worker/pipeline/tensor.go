package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/decode-worker/collective"
	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/model"
)

// A tensor-parallel stage (rank.Layout with Tensor > 1) is several ranks
// that each hold a slice of every layer of the stage (model.Shard) and sum
// their partial outputs with an all-reduce over links of their own (package
// collective). They are consecutive in the ring, so the ring's protocol
// (admission, release, cancel, ready, reset) reaches each of them as it
// reaches any rank. A step enters the stage at its first rank; each rank
// but the last passes the step on as it came, before computing it, so that
// the stage's ranks run it together; after each reduction they hold the
// same bits, and only the stage's last rank sends the result on. On the
// last stage every rank applies the head and draws the tokens alike (the
// logits are gathered bit for bit, and the samplers are seeded alike), so
// that their states stay the same; only the group's last rank sends them to
// the head.
//
// The ranks of a stage must take part in each reduction together, so what
// one rank cannot run, none may: a failed step on a split stage resets the
// group (every job in it fails, as a lost link does), and cancellations
// take effect at step boundaries, as the head's steps carry them, never
// inside a step. The stage's links live as long as a ring: a reset closes
// them (a peer waiting in a reduction is released), and each rank connects
// them again for the next ring's epoch as the Form passes, marking the Form
// to wait until they are up; the head forms the ring once a Form comes back
// unmarked.

// split reports whether this rank's stage is cut over several ranks.
func (w *Worker) split() bool { return w.tensor > 1 }

// tees reports whether the rank passes the steps it gets on to the next
// rank of its stage before computing them.
func (w *Worker) tees() bool { return w.split() && w.tensorRank < w.tensor-1 }

// sends reports whether the rank sends its stage's output on: the stage's
// last rank.
func (w *Worker) sends() bool { return !w.tees() }

// collReady reports whether the rank's stage links are up for epoch, and
// starts connecting them if they are not.
func (w *Worker) collReady(epoch uint64) bool {
	if !w.split() {
		return true
	}
	if w.coll != nil && w.collEpoch == epoch {
		return true
	}
	if w.connecting == nil || w.collEpoch != epoch {
		w.dropCollective()
		w.connectCollective(epoch)
	}
	return false
}

// connectCollective connects the rank's stage links for a ring's epoch in
// the background; the loop installs the group once every peer answered.
func (w *Worker) connectCollective(epoch uint64) {
	l := w.cfg.Layout
	stage, t := l.StageOf(w.cfg.Rank)
	addrs := make([]string, w.tensor)
	for i := range addrs {
		addrs[i] = l.Ranks[l.RankOf(stage, i)].Endpoint
	}
	cfg := collective.ConnectConfig{Group: fmt.Sprintf("%s/%d/stage%d", l.Group, epoch, stage), Rank: t, Ranks: w.tensor,
		Server: w.cfg.Server, Addrs: addrs, Secret: w.cfg.Secret, Transport: w.cfg.Transport, Timeouts: w.cfg.Timeouts}
	ctx, cancel := context.WithCancel(w.ctx)
	w.collEpoch, w.connecting = epoch, cancel
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		links, err := collective.Connect(ctx, cfg)
		var g *collective.Group
		if err == nil {
			g, err = collective.New(collective.Config{Rank: t, Ranks: w.tensor, Links: links})
		}
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("tensor stage: connecting to the stage's ranks", zap.Uint64("epoch", epoch), zap.Error(err))
				_ = w.do(ctx, func() { w.connectFailed(epoch) })
			}
			return
		}
		if w.do(ctx, func() { w.installCollective(g, epoch) }) != nil {
			g.Close()
		}
	}()
}

// installCollective takes a connected group on the loop, unless the rank
// moved on to another epoch meanwhile.
func (w *Worker) installCollective(g *collective.Group, epoch uint64) {
	if w.connecting == nil || w.collEpoch != epoch {
		g.Close()
		return
	}
	w.connecting()
	w.connecting = nil
	w.coll, w.m.Reduce = g, stageReducer{g: g, base: w.ctx, timeout: w.cfg.StepTimeout}
	w.log.Debug("tensor stage: connected", zap.Uint64("epoch", epoch), zap.Int("tensor_rank", w.tensorRank), zap.Int("tensor", w.tensor))
}

// stageReducer bounds each reduction of the stage by the rank's life and
// the step timeout, besides the caller's ctx (the model gathers the logits
// without one): a peer that stalls without closing its links (stopped, not
// dead) then fails the step, and the group resets, instead of holding this
// rank's loop until the peer comes back.
type stageReducer struct {
	g       *collective.Group
	base    context.Context
	timeout time.Duration
}

func (r stageReducer) AllReduce(ctx context.Context, buf []float32) error {
	c, cancel := context.WithTimeout(r.base, r.timeout)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	return r.g.AllReduce(c, buf)
}

// connectFailed lets the next Form of the epoch try again.
func (w *Worker) connectFailed(epoch uint64) {
	if w.connecting != nil && w.collEpoch == epoch {
		w.connecting()
		w.connecting = nil
	}
}

// dropCollective closes the stage's links, or stops their connection:
// peers waiting in a reduction fail at once.
func (w *Worker) dropCollective() {
	if w.connecting != nil {
		w.connecting()
		w.connecting = nil
	}
	if w.coll == nil {
		return
	}
	w.collTotal.add(w.coll.Stats())
	w.coll.Close()
	w.coll, w.m.Reduce = nil, nil
}

// breakStage is a split stage's answer to a step it cannot run: the whole
// group resets, since the stage's other ranks may be waiting for this one
// in a reduction.
func (w *Worker) breakStage(err error) {
	if w.ctx.Err() != nil {
		return
	}
	if pe := (*collective.PeerError)(nil); errors.As(err, &pe) {
		l := w.cfg.Layout
		stage, _ := l.StageOf(w.cfg.Rank)
		peer := l.RankOf(stage, pe.Peer)
		err = fmt.Errorf("decode rank %d lost its tensor-stage peer, rank %d (%s): %w", w.cfg.Rank, peer, l.Ranks[peer].Endpoint, err)
	}
	w.log.Warn("tensor stage: step failed; resetting the group", zap.Error(err))
	if !w.formed {
		w.reset(err)
		return
	}
	up, down := resetLinks(0)
	w.broadcastReset(err, up, down)
}

// collTime is the current group's reduction time so far: a step's share is
// the difference of two readings.
func (w *Worker) collTime() time.Duration {
	if w.coll == nil {
		return 0
	}
	return w.coll.Stats().Total
}

// collStats sums the calls of the stage's groups, the closed ones and the
// current one.
type collStats struct {
	calls uint64
	total time.Duration
}

func (c *collStats) add(s collective.Stats) {
	c.calls += s.Calls
	c.total += s.Total
}

// collectiveStats is the rank's reductions so far.
func (w *Worker) collectiveStats() collStats {
	s := w.collTotal
	if w.coll != nil {
		s.add(w.coll.Stats())
	}
	return s
}

// traceCompute records the rank's compute of a step, and the part of it
// spent in reductions since coll0 (a collTime reading), in its trace.
func (w *Worker) traceCompute(tr *mesh.Trace, compute, coll0 time.Duration) {
	tr.Compute[w.cfg.Rank] = int64(compute)
	if !w.split() {
		return
	}
	if len(tr.Coll) != w.n {
		tr.Coll = make([]int64, w.n)
	}
	tr.Coll[w.cfg.Rank] = int64(w.collTime() - coll0)
}

// gatherOnly is the head's part in the lm_head when the head is on the
// last stage (a single split stage): every rank of the stage gathers the
// vocabulary-parallel logits, in the calls sample makes, but the head draws
// nothing; the tokens come back from the group's last rank.
func (w *Worker) gatherOnly(b *model.Batch, drafts [][]int32) error {
	var err error
	if slices.ContainsFunc(drafts, func(d []int32) bool { return len(d) > 0 }) {
		_, err = w.m.RowLogits(b)
	} else {
		_, err = w.m.Logits(b)
	}
	return err
}

// teeStep passes a step on to the stage's next rank as it came: a copy,
// since the link's writer stamps the step while this rank fills in its
// own trace.
func (w *Worker) teeStep(m *mesh.Msg) {
	h, st := m.Header, *m.Step
	tr := &st.Trace
	tr.Compute, tr.Mesh, tr.Coll, tr.Attn = slices.Clone(tr.Compute), slices.Clone(tr.Mesh), slices.Clone(tr.Coll), maps.Clone(tr.Attn)
	h.Step = &st
	w.send(&h, m.Payload)
}
