package pipeline

import (
	"slices"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/prefixcache"

	"go.uber.org/zap"
)

// Stats is a snapshot of a rank, for tests, metrics and the bench.
type Stats struct {
	Rank, Ranks int
	Epoch       uint64
	Formed      bool // the ring is formed (every link up)

	Sequences     int   // sequences held (admitted and not yet freed)
	ReservedBytes int64 // state memory reserved for them
	BudgetBytes   int64 // 0: unlimited

	// Cache is the rank's prefix cache (zero when off): its entries and
	// bytes (drawn on the same budget as the sequences), and on the head
	// its lookups, hits and the prompt tokens the hits saved.
	Cache prefixcache.Stats
	// CacheSalt, CacheLinks and CacheStride (head, cache on and not
	// paused): the chain's seed, the prefixes a prompt can resume from, the
	// most recently kept entries first (at most MaxAdvertised), and the
	// snapshot stride (prefixkey.Snapshots: where a local prompt's prefill
	// steps end), for the registry.
	CacheSalt   prefixcache.Hash
	CacheLinks  []prefixcache.Link
	CacheStride int

	Steps       int64         // steps this rank computed
	ComputeTime time.Duration // spent in this rank's layers (and sampling on the last rank)
	// PrefillAttention is the part of ComputeTime spent in the MLA
	// attention of prefill steps, for the sequences that went on.
	PrefillAttention time.Duration
	// GrammarDraws are the tokens this rank (the last) drew within a
	// grammar, and GrammarTime the time those draws took: the masks, the
	// masked sampling and the matchers' steps (part of ComputeTime).
	GrammarDraws int64
	GrammarTime  time.Duration

	// Head only.
	Admitted, Refused, Finished, Failed int64
	Queued, InFlight                    int   // sequences waiting for a step; steps in flight
	Tokens                              int64 // tokens delivered to sinks
	// DecodeSteps returned to the head, and the sums of their round trip,
	// of every rank's compute and of every hop's mesh time (encode, transit,
	// decode). Round trip minus compute minus mesh is time spent queued
	// behind other micro-batches.
	DecodeSteps                             int64
	DecodeRows                              int64 // sequences in them
	LargestDecodeStep                       int   // the most sequences in one decode step
	StepTime, StepComputeTime, StepMeshTime time.Duration
	// StepCollectiveTime is the part of StepComputeTime the tensor stages
	// spent in their reductions (0 without tensor parallelism).
	StepCollectiveTime time.Duration
	// Reductions and ReductionTime are this rank's all-reduce calls with
	// its tensor stage and their time (0 without tensor parallelism).
	Reductions    uint64
	ReductionTime time.Duration
	// Speculative decoding: the tokens drafted and accepted, the
	// sequence steps that verified drafts, and AcceptedRuns[a] those that
	// accepted a drafts.
	DraftedTokens, AcceptedTokens, VerifiedSteps int64
	AcceptedRuns                                 []int64
}

// MaxAdvertised bounds the cached prefixes a head advertises.
const MaxAdvertised = 1024

type counters struct {
	steps                               int64
	compute                             time.Duration
	admitted, refused, finished, failed int64
	tokens                              int64
	decodeSteps, decodeRows             int64
	largest                             int
	stepTime, stepCompute, stepMesh     time.Duration
	stepColl                            time.Duration
	prefillAttention                    time.Duration
	drafted, accepted, verifies         int64
	acceptedRuns                        []int64
}

// Stats returns the latest snapshot (taken after each event of the loop).
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.snap
}

// publish refreshes the snapshot and logs a summary now and then.
func (w *Worker) publish() {
	c := &w.counters
	s := Stats{Rank: w.cfg.Rank, Ranks: w.n, Epoch: w.epoch, Formed: w.formed,
		Sequences: w.table.Len(), ReservedBytes: w.table.Reserved(), BudgetBytes: w.table.Limit(),
		Steps: c.steps, ComputeTime: c.compute, PrefillAttention: c.prefillAttention,
		Admitted: c.admitted, Refused: c.refused, Finished: c.finished, Failed: c.failed,
		Queued: len(w.queue) + len(w.overflow), InFlight: len(w.flights), Tokens: c.tokens,
		DecodeSteps: c.decodeSteps, DecodeRows: c.decodeRows, LargestDecodeStep: c.largest,
		StepTime: c.stepTime, StepComputeTime: c.stepCompute, StepMeshTime: c.stepMesh, StepCollectiveTime: c.stepColl,
		GrammarDraws: w.grammarDraws.Load(), GrammarTime: time.Duration(w.grammarNanos.Load()),
		DraftedTokens: c.drafted, AcceptedTokens: c.accepted, VerifiedSteps: c.verifies, AcceptedRuns: slices.Clone(c.acceptedRuns)}
	cs := w.collectiveStats()
	s.Reductions, s.ReductionTime = cs.calls, cs.total
	if w.cache != nil {
		s.Cache = w.cache.Stats()
		if w.head && !w.cacheOff {
			if v := w.cache.Version(); v != w.advertised || w.links == nil {
				w.links, w.advertised = w.cache.Links(MaxAdvertised), v
			}
			s.CacheSalt, s.CacheLinks, s.CacheStride = w.cache.Salt(), w.links, snapshotStride(w.cfg.PrefixCache.Stride)
		}
	}
	w.mu.Lock()
	w.snap = s
	w.mu.Unlock()

	if now := w.now(); now.Sub(w.lastLog) >= 10*time.Second && c.steps != w.logged.steps {
		steps := c.steps - w.logged.steps
		fields := []zap.Field{zap.Int64("steps", steps), zap.Int("sequences", s.Sequences),
			zap.Duration("compute_per_step", (c.compute-w.logged.compute)/time.Duration(steps)),
			zap.Int64("reserved_bytes", s.ReservedBytes)}
		if w.head {
			el := now.Sub(w.lastLog).Seconds()
			fields = append(fields, zap.Float64("tok_per_s", float64(c.tokens-w.logged.tokens)/el))
			if d := c.decodeSteps - w.logged.decodeSteps; d > 0 {
				fields = append(fields,
					zap.Duration("step_time", (c.stepTime-w.logged.stepTime)/time.Duration(d)),
					zap.Duration("step_compute", (c.stepCompute-w.logged.stepCompute)/time.Duration(d)),
					zap.Duration("step_mesh", (c.stepMesh-w.logged.stepMesh)/time.Duration(d)))
			}
		}
		w.log.Info("decode progress", fields...)
		w.lastLog, w.logged = now, *c
	}
}

// snapshotStride is the stride the cache's snapshots are planned with
// (prefixkey.Snapshots rounds one off the KDA grid up onto it).
func snapshotStride(stride int) int {
	return (max(stride, 0) + prefixcache.Block - 1) / prefixcache.Block * prefixcache.Block
}
