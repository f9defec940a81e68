package cpadapter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
)

// cacheTimeout bounds how long a cache request waits for the rank's loop
// (it runs between decode steps).
const cacheTimeout = 10 * time.Second

// cacheRequest answers a coordinator's CacheRequest: this rank's share of
// the group's prefix cache, or a drop of one entry (by the id the group's
// ranks share) or all of them. An operator drops on every rank of the
// group (`coordinator cache drop` does): a rank that lacks an entry the
// head chooses later refuses that admission as a miss and the head admits
// the sequence again without the cache, so a drop that reached only some
// ranks costs a retry, never a wrong state. A sequence that resumed from
// an entry copied its state at admission, so dropping the entry while it
// runs changes nothing for it. The rank beats at once after a drop, so
// that routers stop pricing the dropped prefixes.
func (a *Adapter) cacheRequest(ctx context.Context, req *cp.CacheRequest) (*cp.CacheReply, error) {
	w := a.cfg.Worker
	rep := &cp.CacheReply{WorkerID: a.cfg.WorkerID, Kind: cp.KindDecode, Model: a.cfg.ModelID,
		CacheDType: strings.ToLower(w.CacheDType().String()), GroupID: a.cfg.Layout.Group, Rank: a.cfg.Rank}
	if req.WorkerID != a.cfg.WorkerID {
		rep.SetError(cp.CodeBadRequest, fmt.Sprintf("decode rank %s: the cache request is addressed to %s", a.cfg.WorkerID, req.WorkerID))
		return rep, nil
	}
	if !w.CacheOn() {
		rep.Off = true
		return rep, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cacheTimeout)
	defer cancel()
	if req.Op == cp.CacheDrop {
		var id uint64
		if !req.All {
			n, err := strconv.ParseUint(req.Key, 10, 64)
			if err != nil || n == 0 {
				rep.SetError(cp.CodeBadRequest, fmt.Sprintf("decode rank %s: cache entry key %q: a decode group's entries are named by positive integers (see `coordinator cache list`)", a.cfg.WorkerID, req.Key))
				return rep, nil
			}
			id = n
		}
		n, err := w.DropCache(ctx, id) // id 0: every entry
		if err != nil {
			return nil, &cp.RemoteError{Code: cp.CodeUnavailable, Message: fmt.Sprintf("decode rank %s: dropping cache entries: %v", a.cfg.WorkerID, err)}
		}
		rep.Dropped = n
		a.log.Info("prefix cache entries dropped on request", zap.String("key", req.Key), zap.Int("dropped", n))
		a.life.Beat()
	}
	list, err := w.CacheEntries(ctx)
	if err != nil {
		return nil, &cp.RemoteError{Code: cp.CodeUnavailable, Message: fmt.Sprintf("decode rank %s: listing cache entries: %v", a.cfg.WorkerID, err)}
	}
	rep.Total = len(list)
	for _, e := range list {
		rep.Bytes += e.Bytes
	}
	if req.Op == cp.CacheList {
		rep.Entries = cacheEntries(list)
	}
	return rep, nil
}

// cacheEntries lists a rank's entries as the protocol does, the most
// recently used first, at most cp.MaxCacheEntries.
func cacheEntries(in []prefixcache.Info) []cp.CacheEntry {
	out := make([]cp.CacheEntry, 0, min(len(in), cp.MaxCacheEntries))
	for _, e := range in[:min(len(in), cp.MaxCacheEntries)] {
		c := cp.CacheEntry{Key: strconv.FormatUint(e.ID, 10), Tokens: e.Tokens, Snapshots: len(e.Snapshots), Bytes: e.Bytes, LastUse: e.LastUse}
		if e.Link != 0 {
			c.Prefix = fmt.Sprintf("%016x", uint64(e.Link))
		}
		out = append(out, c)
	}
	return out
}
