// Package executor runs one layer-streamed prefill pass: it embeds the
// pass's tokens, takes each layer from the weight streamer as it lands,
// binds it on the backend, applies it to every sequence of the pass in tiles
// of rows, hands finished layers' states to their sinks, and drops
// sequences whose job was cancelled or whose sink failed without disturbing
// the others.
package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

// Seq is one job's piece of a pass.
type Seq struct {
	ID string
	// Ctx is the job's context: once it is done the sequence is dropped at
	// the next layer boundary.
	Ctx context.Context
	// State continues from earlier super-chunks and holds every layer.
	State *model.SeqState
	// Tokens are the piece's token ids.
	Tokens []int32
	// Media are the image feature rows that replace embedded rows of this
	// piece (positions count from its first token): the piece's window of
	// the job's images (model.MediaWindow).
	Media []model.Media
	// Final pieces end their prompt: each layer's state goes to Out as soon
	// as the layer is done, and leaves State.
	Final bool
	Out   *sink.Queue

	// Err is why the sequence was dropped (nil if it completed the pass);
	// Emitted counts the layers handed to Out.
	Err     error
	Emitted int
}

// Options tune one pass.
type Options struct {
	Depth int // prefetch depth (the streamer's ring must hold depth+1)
	Tile  int // rows per layer call; 0 runs each layer over the whole batch
	Pass  int // pass number, for logs
	// SinkTimeout bounds how long a layer waits for a full sink queue before
	// the job is failed (0: a minute).
	SinkTimeout time.Duration
	// Progress, if set, is called after every layer.
	Progress func(Progress)
}

// Progress is a pass's position after a layer.
type Progress struct {
	Pass, Layer, Layers int // Layer: layers done
	Tokens              int // tokens in the pass now
	Bytes               int64
	ReadGBps            float64 // bytes read / time since the pass started
	Elapsed, ETA        time.Duration
	// LayerCompute is the time this layer took to bind and run (not
	// counting the wait for its weights or the hand-over of its states).
	LayerCompute time.Duration
}

// Stats are a pass's figures.
type Stats struct {
	Layers, Tokens int
	Bytes          int64         // read from disk
	Wall           time.Duration // pass start to last layer done
	ReadWait       time.Duration // compute idle, waiting for weights
	ReadWall       time.Duration // pass start to the last byte read
	ReadBusy       time.Duration // time with a read in flight (Bytes / ReadBusy: the read rate)
	Compute        time.Duration // binding and running layers
	Attention      time.Duration // of Compute, in the MLA attention (zero when the backend is not timed)
	Calls          int           // layer calls (a layer cut into several calls counts each)
	Emit           time.Duration // handing states to sink queues
	Embed          time.Duration
}

// Executor runs passes of one model on one backend.
type Executor struct {
	Model  *model.Model // config, backend, state options; no weights resident
	Stream *streamer.Streamer
	Embed  *Embedder
	Log    *zap.Logger
	// TileFLOPs bounds the work of one layer call (0: DefaultTileFLOPs):
	// a cancelled job leaves its pass at the next call.
	TileFLOPs float64

	onCall func(layer int, rows planner.Range) // tests: after each call of a layer cut into several
}

// ErrNoSeqs is returned by a pass with nothing to do.
var ErrNoSeqs = errors.New("executor: no sequences")

// Run runs one pass over every layer. It returns an error when the pass
// itself failed (weights unreadable, a layer that does not bind): every
// sequence still in the pass then carries that error too. Sequences dropped
// on their own (cancelled, sink failure, bad tokens) carry their error and
// the pass goes on. A device that fails under an op (kernels.DeviceError)
// fails the pass the same way, not the process.
func (e *Executor) Run(ctx context.Context, seqs []*Seq, opt Options) (Stats, error) {
	st, err := e.runCatchingDevice(ctx, seqs, opt)
	var dev *kernels.DeviceError
	if errors.As(err, &dev) {
		err = e.failAll(seqs, fmt.Errorf("pass %d: %w", opt.Pass, err))
	}
	return st, err
}

// runCatchingDevice is run with a device failure returned as its error
// (CatchDevice must itself be the deferred call for its recover to work).
func (e *Executor) runCatchingDevice(ctx context.Context, seqs []*Seq, opt Options) (st Stats, err error) {
	defer kernels.CatchDevice(&err)
	return e.run(ctx, seqs, opt)
}

func (e *Executor) run(ctx context.Context, seqs []*Seq, opt Options) (Stats, error) {
	var st Stats
	if len(seqs) == 0 {
		return st, ErrNoSeqs
	}
	log := e.Log
	if log == nil {
		log = zap.NewNop()
	}
	if opt.SinkTimeout <= 0 {
		opt.SinkTimeout = time.Minute
	}
	cfg, be := e.Model.Cfg, e.Model.Backend
	start := time.Now()

	// Start reading layer 0 at once; embed meanwhile.
	pass, err := e.Stream.Start(ctx, opt.Depth)
	if err != nil {
		return st, e.failAll(seqs, fmt.Errorf("pass %d: %w", opt.Pass, err))
	}
	defer pass.Close()

	r := run{e: e, seqs: make([]*Seq, 0, len(seqs)), tile: opt.Tile}
	var ids []int32
	for _, s := range seqs {
		switch {
		case len(s.Tokens) == 0:
			s.Err = fmt.Errorf("job %s: no tokens to prefill in this pass", s.ID)
		case s.State == nil || len(s.State.Layers) != cfg.NumLayers:
			s.Err = fmt.Errorf("job %s: state does not hold the model's %d layers", s.ID, cfg.NumLayers)
		case badToken(s.Tokens, cfg.VocabSize) >= 0:
			i := badToken(s.Tokens, cfg.VocabSize)
			s.Err = fmt.Errorf("job %s: token id %d at position %d is outside the vocabulary [0, %d)", s.ID, s.Tokens[i], i, cfg.VocabSize)
		case e.Model.CheckMedia(s.Media, len(s.Tokens)) != nil:
			s.Err = fmt.Errorf("job %s: %w", s.ID, e.Model.CheckMedia(s.Media, len(s.Tokens)))
		default:
			r.seqs = append(r.seqs, s)
			ids = append(ids, s.Tokens...)
		}
		if s.Err != nil && s.Out != nil {
			s.Out.Abort(s.Err)
		}
	}
	if len(r.seqs) == 0 {
		return st, ErrNoSeqs
	}
	t0 := time.Now()
	table, local, err := e.Embed.Table(ids)
	if err != nil {
		return st, e.failAll(r.seqs, fmt.Errorf("pass %d: %w", opt.Pass, err))
	}
	r.b = &model.Batch{Attention: map[*model.SeqState]time.Duration{}}
	defer func() { e.Model.FreeBatch(r.b) }()
	r.relayout()
	if err := be.Bind(table); err != nil {
		return st, e.failAll(r.seqs, fmt.Errorf("pass %d: embedding rows: %w", opt.Pass, err))
	}
	r.b.Partial = be.NewTensor(len(ids), cfg.HiddenSize)
	be.Embed(r.b.Partial, table, local)
	be.Release(table)
	for i, s := range r.seqs {
		e.Model.OverrideRows(r.b.Partial, r.b.Spans[i].Lo, s.Media)
	}
	st.Embed = time.Since(t0)

	lastLog := time.Now()
	for L := 0; L < cfg.NumLayers; L++ {
		r.dropCancelled(L)
		if len(r.seqs) == 0 {
			log.Info("pass stopped: every job left it", zap.Int("pass", opt.Pass), zap.Int("layer", L))
			break
		}
		slot, err := pass.Next(ctx)
		if err != nil {
			return st, e.failAll(r.seqs, fmt.Errorf("pass %d: %w", opt.Pass, err))
		}
		t1 := time.Now()
		layer, err := model.BindLayer(cfg, L, slot.Source())
		if err == nil {
			err = bindMatrices(be, layer)
		}
		if err != nil {
			slot.Release()
			return st, e.failAll(r.seqs, fmt.Errorf("pass %d: binding layer %d from %s: %w", opt.Pass, L, e.Stream.Layout().Files[e.Stream.Layout().Layers[L].Extents[0].File], err))
		}
		err = r.runLayer(ctx, layer)
		for _, w := range layer.Matrices() {
			be.Release(w)
		}
		slot.Release()
		layerCompute := time.Since(t1)
		st.Compute += layerCompute
		if err != nil {
			return st, e.failAll(r.seqs, fmt.Errorf("pass %d: layer %d: %w", opt.Pass, L, err))
		}
		st.Layers = L + 1

		t2 := time.Now()
		r.emit(L, opt.SinkTimeout)
		st.Emit += time.Since(t2)

		ps := pass.Stats()
		el := time.Since(start)
		pr := Progress{Pass: opt.Pass, Layer: L + 1, Layers: cfg.NumLayers, Tokens: r.b.Rows(), Bytes: ps.Bytes,
			ReadGBps: float64(ps.Bytes) / el.Seconds() / 1e9, Elapsed: el,
			ETA: time.Duration(float64(el) / float64(L+1) * float64(cfg.NumLayers-L-1)), LayerCompute: layerCompute}
		if opt.Progress != nil {
			opt.Progress(pr)
		}
		if time.Since(lastLog) >= 2*time.Second || L == cfg.NumLayers-1 {
			lastLog = time.Now()
			log.Info("pass progress", zap.Int("pass", opt.Pass), zap.String("layer", fmt.Sprintf("%d/%d", L+1, cfg.NumLayers)),
				zap.Float64("read_gbps", round(pr.ReadGBps)), zap.Int("tokens", pr.Tokens), zap.Int("jobs", len(r.seqs)),
				zap.Duration("elapsed", el.Round(time.Millisecond)), zap.Duration("eta", pr.ETA.Round(time.Millisecond)))
		}
	}
	for i, s := range r.seqs {
		s.State.Tokens += r.b.Spans[i].Len()
	}
	ps := pass.Stats()
	st.Bytes, st.ReadWait, st.ReadWall, st.ReadBusy, st.Wall = ps.Bytes, ps.Wait, ps.ReadWall, ps.ReadBusy, time.Since(start)
	st.Tokens = len(ids)
	st.Calls = r.calls
	for _, d := range r.b.Attention {
		st.Attention += d
	}
	if err := pass.Close(); err != nil && st.Layers == cfg.NumLayers {
		log.Warn("pass read error after the last layer was consumed", zap.Error(err))
	}
	return st, nil
}

func round(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

func badToken(ids []int32, vocab int) int {
	for i, id := range ids {
		if id < 0 || int(id) >= vocab {
			return i
		}
	}
	return -1
}

func bindMatrices(be kernels.Backend, l *model.Layer) error {
	for _, w := range l.Matrices() {
		if err := be.Bind(w); err != nil {
			return err
		}
	}
	return nil
}

// failAll gives every sequence the pass's error and aborts its sink.
func (e *Executor) failAll(seqs []*Seq, err error) error {
	for _, s := range seqs {
		if s.Err == nil {
			s.Err = fmt.Errorf("job %s: %w", s.ID, err)
			if s.Out != nil {
				s.Out.Abort(s.Err)
			}
		}
	}
	return err
}

// run is one pass's batch: the live sequences, laid out back to back.
type run struct {
	e     *Executor
	seqs  []*Seq
	b     *model.Batch
	tile  int
	calls int // layer calls so far
}

// relayout recomputes the batch's sequences and spans from r.seqs.
func (r *run) relayout() {
	r.b.Seqs = r.b.Seqs[:0]
	r.b.Spans = r.b.Spans[:0]
	off := 0
	for _, s := range r.seqs {
		r.b.Seqs = append(r.b.Seqs, s.State)
		r.b.Spans = append(r.b.Spans, kernels.Span{Lo: off, Hi: off + len(s.Tokens)})
		off += len(s.Tokens)
	}
}

// drop removes sequence i from the batch: its rows are squeezed out of the
// partial sum, every block of the stack and any extra tensors of the batch's
// rows in place (no new memory), and its sink is aborted.
func (r *run) drop(i int, err error, extra ...*kernels.Tensor) {
	s := r.seqs[i]
	s.Err = err
	if s.Out != nil {
		s.Out.Abort(err)
	}
	r.e.Model.DropSeq(r.b, i, extra...)
	r.seqs = append(r.seqs[:i], r.seqs[i+1:]...)
	r.e.log().Info("job dropped from the pass", zap.String("job", s.ID), zap.Error(err))
}

func (e *Executor) log() *zap.Logger {
	if e.Log == nil {
		return zap.NewNop()
	}
	return e.Log
}

// dropCancelled drops sequences whose job context is done.
func (r *run) dropCancelled(L int) {
	for i := 0; i < len(r.seqs); {
		s := r.seqs[i]
		if s.Ctx != nil && s.Ctx.Err() != nil {
			r.drop(i, fmt.Errorf("job %s: cancelled before layer %d: %w", s.ID, L, context.Cause(s.Ctx)))
			continue
		}
		i++
	}
}

// emit hands layer L's state of every final sequence to its sink queue,
// waiting at most timeout for room; a sequence whose sink is stuck or
// failed is dropped.
func (r *run) emit(L int, timeout time.Duration) {
	for i := 0; i < len(r.seqs); {
		s := r.seqs[i]
		if !s.Final {
			i++
			continue
		}
		ls := s.State.Layers[L]
		s.State.Layers[L] = nil // ownership passes to the sink
		pctx := s.Ctx
		if pctx == nil {
			pctx = context.Background()
		}
		tctx, cancel := context.WithTimeout(pctx, timeout)
		err := s.Out.Put(tctx, ls)
		cancel()
		if err != nil {
			r.drop(i, fmt.Errorf("job %s: handing layer %d's state to the sink: %w", s.ID, L, err))
			continue
		}
		s.Emitted++
		i++
	}
}

// runLayer applies the layer to the batch in calls of at most the memory
// tile's rows, each within the executor's TileFLOPs of work (the cost
// model's count for the layer at the rows' positions: a layer over a long
// context is cut finer), so that a job cancelled or past its deadline
// leaves at the next call: between calls, cancelled sequences are dropped
// with this layer's partial work (their rows leave the batch; their state
// goes with them), and the others go on. The calls compute exactly what
// one call over the batch does (model.RunLayerInCalls).
func (r *run) runLayer(ctx context.Context, l *model.Layer) error {
	m := r.e.Model
	budget := r.e.TileFLOPs
	if budget <= 0 {
		budget = DefaultTileFLOPs
	}
	cfg := &m.Cfg.Config
	n, err := m.RunLayerInCalls(ctx, l, r.b, model.PhasePrefill, model.Calls{
		Tile:    r.tile,
		Budget:  budget,
		Cost:    func(L, lo, hi int) float64 { return costmodel.LayerFLOPs(cfg, L, lo, hi).Total() },
		Between: r.dropCancelledWithin,
		After: func(L, lo, hi int) {
			if r.e.onCall != nil {
				r.e.onCall(L, planner.Range{Lo: lo, Hi: hi})
			}
		},
	})
	r.calls += n
	return err
}

// DefaultTileFLOPs bounds one layer call's work (Executor.TileFLOPs): about
// 0.05-0.15 s of the CPU backend on one core, so that a cancelled job leaves
// a layer well within a second.
const DefaultTileFLOPs = model.DefaultCallFLOPs

// dropCancelledWithin drops, between two calls of layer L, the sequences
// whose job context is done: their rows leave the batch (the partial sum,
// the stack and next, the layer's new partial sum at a block start), so
// the rest of the layer runs without them. from is the first row not yet
// run; it returns it in the new layout.
func (r *run) dropCancelledWithin(L, from int, next *kernels.Tensor) int {
	for i := 0; i < len(r.seqs); {
		s := r.seqs[i]
		if s.Ctx == nil || s.Ctx.Err() == nil {
			i++
			continue
		}
		sp := r.b.Spans[i]
		from -= min(max(from-sp.Lo, 0), sp.Len())
		r.drop(i, fmt.Errorf("job %s: cancelled during layer %d: %w", s.ID, L, context.Cause(s.Ctx)), next)
	}
	return from
}
