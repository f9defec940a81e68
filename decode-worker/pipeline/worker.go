// Package pipeline is a decode rank's stage loop: the sequences it holds,
// the steps it computes, and its part in the group's pipeline.
//
// Rank 0 (the head) is the group's front door. It admits sequences (every
// rank reserves their state, or one refuses and nothing is kept), prefills
// short prompts itself and schedules the steps: all active sequences advance
// together in batched steps, split into micro-batches so that several steps
// are in flight and no rank idles while another works. Each rank runs its
// layer range over a step's activations and passes them on; the last rank
// applies the final mix, norm and lm_head, samples, and sends the tokens
// back to rank 0, which hands them to the sequence's sink and feeds them in
// as the next step's input.
//
// Any lost link resets the whole group: every rank drops its sequences (the
// head ends each with an error naming the link), the links are redialed, and
// rank 0 forms the ring again before it admits new sequences.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/decode-worker/collective"
	"github.com/tandem-inference/tandem/decode-worker/draft"
	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
)

// Config configures one rank's worker.
type Config struct {
	Rank   int
	Layout *rank.Layout
	// Model holds the rank's resident layers (and the embedding on rank 0,
	// the head on the last rank); its State options set how states are kept.
	Model *model.Model
	// Server is the rank's kvtransfer server: remote states arrive on it and
	// the previous rank's mesh channel is accepted on it. Required unless
	// the group has one rank and takes no remote states.
	Server *kvtransfer.Server
	// Secret authenticates the mesh channels (at least 16 bytes).
	Secret []byte
	// Transport dials the next rank (default TCP).
	Transport kvtransfer.Transport
	Timeouts  kvtransfer.Timeouts
	// MemoryBudget bounds the rank's sequence state in bytes (0: the layout's
	// value for the rank, and if that is 0 too, unlimited).
	MemoryBudget int64
	// MicroBatches is the number of steps in flight (default: the stages).
	MicroBatches int
	// MaxBatch bounds the sequences of one decode step (default 64).
	MaxBatch int
	// PrefillChunk bounds the prompt rows of one prefill step; a multiple
	// of model.KDAChunk so that chunked prefill is bit-identical to whole
	// (default 512; negative: a whole prompt per step).
	PrefillChunk int
	// Heartbeat and Idle bound how fast a dead link is noticed (mesh.Config).
	Heartbeat, Idle time.Duration
	// CallFLOPs bounds the work of one call of a layer in a prefill step
	// (the cost model's count; default model.DefaultCallFLOPs): a long
	// prompt's layer runs in several calls, between which a cancelled
	// sequence leaves the step (cancel.go).
	CallFLOPs float64
	// StepTimeout bounds a step's round trip; when it passes the head resets
	// the group (default 5 min).
	StepTimeout time.Duration
	// FormRetry is how often rank 0 retries forming the ring (default 250 ms).
	FormRetry time.Duration
	// PrefixCache sets up the rank's prefix-state cache; every rank of a
	// group must be given the same settings.
	PrefixCache PrefixCacheConfig
	// Vocabulary, on the last rank, is the tokenizer's vocabulary for
	// sequences with a grammar (Request.Grammar); without it such
	// sequences are refused.
	Vocabulary *grammar.Vocabulary
	// Draft sets up speculative decoding (the head drafts; every rank
	// verifies). On unless Draft.Off.
	Draft DraftConfig
	// Log receives the rank's logs, with the group and rank added.
	Log *zap.Logger
}

// PrefixCacheConfig configures the prefix-state cache (package
// prefixcache). It is on unless Off: finished prompts' states stay in the
// rank's memory budget until a sequence needs the room.
type PrefixCacheConfig struct {
	Off bool
	// Stride adds a snapshot every Stride prefilled tokens (a multiple of
	// model.KDAChunk; 0: only at the prompt's end), so that prompts that
	// share only the start of a cached one (a system prompt) find a
	// resumable state. Each snapshot costs the rank's KDA states (about
	// 434 MB at K3's full size over all ranks).
	Stride int
	// ModelID names the model (its checkpoint's identity); it seeds the
	// cache's hashes together with the cache dtype.
	ModelID string
	// Hash replaces the chain's hash (tests force collisions with it).
	Hash prefixcache.HashFunc
}

// Worker is one rank of a decode group.
type Worker struct {
	cfg      Config
	m        *model.Model
	n        int // ranks
	lo, hi   int
	head     bool
	last     bool // on the last stage: applies the lm_head and samples
	ringLast bool // the group's last rank: sends the tokens to the head
	// A tensor-parallel stage (tensor.go): this rank's place in it, and its
	// all-reduce with the stage's other ranks (nil until connected).
	tensorRank, tensor int
	coll               *collective.Group
	collEpoch          uint64             // the ring epoch coll is (being) connected for
	connecting         context.CancelFunc // stops a connection under way (nil: none)
	collTotal          collStats          // the reductions of the closed groups
	maxSteps           int
	log                *zap.Logger
	now                func() time.Time // the clock: the loop's only one; the step core takes readings
	ring               *mesh.Ring
	dtype              model.DType
	grammars           *grammar.Cache // compiled once per distinct spec
	// grammarDraws and grammarNanos count the draws within grammars and
	// their time (Stats).
	grammarDraws, grammarNanos atomic.Int64

	ctx    context.Context
	cancel context.CancelFunc
	calls  chan func()
	done   chan struct{}
	wg     sync.WaitGroup // commit waiters

	// Owned by the loop.
	table      *rank.Table
	cache      *prefixcache.Cache // nil when off
	cacheOff   bool               // head: the cache is paused (SetPrefixCache)
	links      []prefixcache.Link // head: the advertised prefixes, as of cache version advertised
	advertised uint64
	seqs       map[string]*seq
	epoch      uint64
	formed     bool
	commits    chan commit
	nextStep   uint64
	flights    map[uint64]*flight
	queue      []*seq  // head: sequences with prompt chunks to prefill
	overflow   []*seq  // head: decoding sequences waiting for room in a slot
	slots      []*slot // head: the decode micro-batches
	counters   counters
	lastLog    time.Time
	logged     counters

	curve     costCurve           // head: the measured cost of a decode step by rows
	session   *draft.SessionIndex // head: earlier sequences' tokens to draft from (nil: none)
	sessionID uint64

	cancels     cancelSet           // sequences being cancelled, for steps in progress (cancel.go)
	onCall      onCallHook          // tests: after each call of a prefill step's layer
	cancelEnded map[string]struct{} // head: sequences ended by a step that dropped them, until their Cancel returns

	mu       sync.Mutex
	snap     Stats
	formedCh chan struct{} // closed while the ring is formed
}

// Start starts the rank: its mesh links (if the group has several ranks)
// and its loop.
func Start(cfg Config) (*Worker, error) {
	l := cfg.Layout
	if l == nil || cfg.Model == nil {
		return nil, errors.New("pipeline: a layout and a model are required")
	}
	if err := l.Validate(cfg.Model.Cfg.NumLayers); err != nil {
		return nil, err
	}
	if cfg.Rank < 0 || cfg.Rank > l.Last() {
		return nil, fmt.Errorf("pipeline: rank %d is not in group %q (ranks 0..%d)", cfg.Rank, l.Group, l.Last())
	}
	spec := l.Ranks[cfg.Rank]
	for L := spec.Lo; L < spec.Hi; L++ {
		if cfg.Model.Layers[L] == nil {
			return nil, fmt.Errorf("pipeline: rank %d owns layer %d, which is not loaded", cfg.Rank, L)
		}
	}
	head, last := cfg.Rank == 0, l.HoldsHead(cfg.Rank)
	if g := cfg.Model.Globals; head && (g == nil || g.Embed == nil) || last && (g == nil || g.LMHead == nil) {
		return nil, fmt.Errorf("pipeline: rank %d needs the embedding (rank 0) and the lm_head (the last stage) loaded", cfg.Rank)
	}
	if want := l.Shard(cfg.Rank); cfg.Model.Shard != want && (want.Split() || cfg.Model.Shard.Split()) {
		return nil, fmt.Errorf("pipeline: rank %d is %s of its stage, but its model was loaded as %s", cfg.Rank, want, cfg.Model.Shard)
	}
	if l.TensorRanks() > 1 && cfg.Server == nil {
		return nil, fmt.Errorf("pipeline: rank %d of a tensor-parallel stage needs a kvtransfer server for the stage's links", cfg.Rank)
	}
	if cfg.MicroBatches <= 0 {
		// One step in flight per stage: a tensor stage's ranks run a step
		// together, so more would queue behind it.
		cfg.MicroBatches = l.Stages()
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 64
	}
	switch {
	case cfg.PrefillChunk == 0:
		cfg.PrefillChunk = 512
	case cfg.PrefillChunk > 0 && cfg.PrefillChunk%model.KDAChunk != 0:
		return nil, fmt.Errorf("pipeline: prefill chunk %d is not a multiple of %d", cfg.PrefillChunk, model.KDAChunk)
	}
	if !(cfg.CallFLOPs > 0) {
		cfg.CallFLOPs = model.DefaultCallFLOPs
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 5 * time.Minute
	}
	if cfg.FormRetry <= 0 {
		cfg.FormRetry = 250 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Draft.KMax <= 0 {
		cfg.Draft.KMax = 4
	}
	cfg.Draft.KMax = min(cfg.Draft.KMax, MaxDraft)
	budget := cfg.MemoryBudget
	if budget == 0 {
		budget = spec.MemoryBudget
	}
	dtype := cfg.Model.State.LatentDType
	if dtype == 0 {
		dtype = model.BF16
	}
	_, tensorRank := l.StageOf(cfg.Rank)
	w := &Worker{cfg: cfg, m: cfg.Model, n: len(l.Ranks), lo: spec.Lo, hi: spec.Hi, head: head, last: last,
		ringLast: cfg.Rank == l.Last(), tensorRank: tensorRank, tensor: l.TensorRanks(),
		maxSteps: cfg.MicroBatches, dtype: dtype, now: time.Now,
		log:   cfg.Log.With(zap.String("group", l.Group), zap.Int("rank", cfg.Rank)),
		calls: make(chan func()), done: make(chan struct{}), commits: make(chan commit),
		table: rank.NewTable(cfg.Model.Cfg, spec.Lo, spec.Hi, budget, model.StateOptions{LatentDType: dtype, Shard: l.Shard(cfg.Rank)}),
		seqs:  map[string]*seq{}, flights: map[uint64]*flight{}, formedCh: make(chan struct{}),
		cancelEnded: map[string]struct{}{}, grammars: grammar.NewCache(16)}
	if v := cfg.Vocabulary; v != nil && v.Size() != cfg.Model.Cfg.VocabSize {
		return nil, fmt.Errorf("pipeline: the grammar vocabulary has %d ids, the model %d", v.Size(), cfg.Model.Cfg.VocabSize)
	}
	w.lastLog = w.now()
	for range w.maxSteps {
		w.slots = append(w.slots, &slot{})
	}
	if pc := cfg.PrefixCache; !pc.Off {
		if pc.Stride < 0 {
			return nil, fmt.Errorf("pipeline: prefix cache stride %d is negative", pc.Stride)
		}
		w.cache = prefixcache.New(prefixcache.Config{Model: cfg.Model.Cfg, Lo: spec.Lo, Hi: spec.Hi, DType: dtype,
			Salt: prefixcache.Salt(pc.ModelID, dtype), Hash: pc.Hash, Budget: w.table.Budget(), Index: head})
		if head && !cfg.Draft.Off {
			w.session, _ = draft.NewSessionIndex(sessionConfig) // valid settings
		}
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	if w.n > 1 {
		r, err := mesh.Start(mesh.Config{Group: l.Group, Rank: cfg.Rank, Ranks: w.n, Server: cfg.Server,
			Next: l.Ranks[(cfg.Rank+1)%w.n].Endpoint, Secret: cfg.Secret, Transport: cfg.Transport,
			Timeouts: cfg.Timeouts, Heartbeat: cfg.Heartbeat, Idle: cfg.Idle, Early: w.early, Log: w.log})
		if err != nil {
			w.cancel()
			return nil, err
		}
		w.ring = r
	} else {
		w.setFormed(true) // a group of one is its own ring
	}
	if w.split() {
		// The model reduces through the stage's group, which the loop
		// installs and replaces; no other holder may share this copy.
		m := *cfg.Model
		w.m, w.cfg.Model = &m, &m
		w.m.Reduce = nil
	}
	w.publish()
	go w.run()
	w.log.Info("decode rank started", zap.Int("ranks", w.n), zap.Int("lo", w.lo), zap.Int("hi", w.hi),
		zap.Int64("budget", budget), zap.Int("micro_batches", w.maxSteps))
	return w, nil
}

// Rank is the worker's rank.
func (w *Worker) Rank() int { return w.cfg.Rank }

// Close stops the rank: every sequence it holds ends (on the head, with an
// error to its sink), the links close and the goroutines exit.
func (w *Worker) Close() error {
	w.cancel()
	<-w.done
	if w.ring != nil {
		w.ring.Close()
	}
	w.wg.Wait()
	return nil
}

// WaitReady waits until the ring is formed (every link up) or ctx ends.
func (w *Worker) WaitReady(ctx context.Context) error {
	for {
		w.mu.Lock()
		ch := w.formedCh
		formed := w.snap.Formed
		w.mu.Unlock()
		if formed {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("decode rank %d: waiting for the ring: %w", w.cfg.Rank, ctx.Err())
		case <-w.done:
			return fmt.Errorf("decode rank %d: closed", w.cfg.Rank)
		}
	}
}

// do runs fn on the loop and waits for it to be taken.
func (w *Worker) do(ctx context.Context, fn func()) error {
	select {
	case w.calls <- fn:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.done:
		return fmt.Errorf("decode rank %d: closed", w.cfg.Rank)
	}
}

func (w *Worker) run() {
	defer close(w.done)
	var events <-chan mesh.Event
	if w.ring != nil {
		events = w.ring.Events()
	}
	tick := time.NewTicker(w.cfg.FormRetry)
	defer tick.Stop()
	for {
		if w.runnable() {
			// Work is waiting: first take everything that has arrived,
			// without blocking. Steps run on this goroutine, so taking one
			// message per step made each admission (a call here, the Admit
			// around the ring, its return) wait several steps per hop, and
			// 200 admissions at once outlasted the coordinator's
			// assignment timeout; now a message waits one step at most.
		drain:
			for range maxDrain {
				select {
				case <-w.ctx.Done():
					w.shutdown()
					return
				case fn := <-w.calls:
					fn()
				case ev := <-events:
					w.onEvent(ev)
				case c := <-w.commits:
					w.onCommit(c)
				default:
					break drain
				}
			}
		} else {
			select {
			case <-w.ctx.Done():
				w.shutdown()
				return
			case fn := <-w.calls:
				fn()
			case ev := <-events:
				w.onEvent(ev)
			case c := <-w.commits:
				w.onCommit(c)
			case <-tick.C:
				w.onTick()
			}
		}
		w.schedule()
		w.publish()
	}
}

// maxDrain bounds the messages the loop takes between two steps, so that
// a flood of them cannot hold the steps back either.
const maxDrain = 1024

// shutdown ends everything on Close.
func (w *Worker) shutdown() {
	w.reset(errors.New("decode worker closed"))
	w.publish()
}

func (w *Worker) setFormed(f bool) {
	w.formed = f
	w.mu.Lock()
	defer w.mu.Unlock()
	if f == w.snap.Formed {
		return
	}
	w.snap.Formed = f
	if f {
		close(w.formedCh)
	} else {
		w.formedCh = make(chan struct{})
	}
}

// PrefillChunk is the prompt rows of one prefill step; queued prompts are
// served in turn, a chunk each. 0 means whole prompts, in arrival order.
func (w *Worker) PrefillChunk() int { return max(w.cfg.PrefillChunk, 0) }
