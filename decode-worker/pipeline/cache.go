package pipeline

import (
	"context"
	"fmt"

	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/model"
)

// CacheDType is the rank's MLA cache dtype: with the model's identity, what
// the prefix cache's keys are seeded with.
func (w *Worker) CacheDType() model.DType { return w.dtype }

// CacheOn reports whether the rank keeps a prefix cache.
func (w *Worker) CacheOn() bool { return w.cache != nil }

// CacheEntries lists the rank's prefix-cache entries, the most recently
// used first (nil when the cache is off).
func (w *Worker) CacheEntries(ctx context.Context) ([]prefixcache.Info, error) {
	out := make(chan []prefixcache.Info, 1)
	if err := w.do(ctx, func() {
		if w.cache == nil {
			out <- nil
			return
		}
		out <- w.cache.List()
	}); err != nil {
		return nil, err
	}
	select {
	case l := <-out:
		return l, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// DropCache drops prefix-cache entries from this rank: the entry id, or
// every entry when id is 0. It returns how many went. A rank that lacks an
// entry the head later chooses refuses that admission as a miss and the
// head admits the sequence again without the cache, so dropping on one
// rank is safe; an operator drops on every rank.
func (w *Worker) DropCache(ctx context.Context, id uint64) (int, error) {
	out := make(chan int, 1)
	if err := w.do(ctx, func() {
		n := 0
		switch {
		case w.cache == nil:
		case id == 0:
			n = len(w.cache.List())
			w.cache.Clear()
		case w.cache.Drop(id):
			n = 1
		}
		// The snapshot (what the rank's heartbeat advertises) without the
		// dropped entries before the caller hears of the drop.
		w.publish()
		out <- n
	}); err != nil {
		return 0, err
	}
	select {
	case n := <-out:
		return n, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// SetPrefixCache pauses (on false) or resumes the group's use of the
// prefix cache, on the head, which makes every cache decision: while paused
// no prompt resumes from the cache and none is kept (a benchmark measures
// the same workload both ways on one deployment). Entries already kept
// stay until they are dropped or evicted.
func (w *Worker) SetPrefixCache(ctx context.Context, on bool) error {
	if !w.head {
		return fmt.Errorf("decode group: the prefix cache is switched on rank 0 (the head); this is rank %d", w.cfg.Rank)
	}
	return w.do(ctx, func() { w.cacheOff = !on })
}
