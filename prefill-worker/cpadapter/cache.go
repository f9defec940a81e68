package cpadapter

import (
	"context"
	"fmt"
	"strings"

	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/prefill-worker/prefixstore"
)

// cacheRequest answers a coordinator's CacheRequest: the prefix store's
// entries, or a drop of one or all of them. A job resuming from an entry
// read it whole before its pass, so dropping it costs only later jobs
// their shortcut; an entry still being written when the drop comes is
// kept when its job commits it. The worker beats at once after a drop, so
// that routers stop pricing the dropped prefixes.
func (a *Adapter) cacheRequest(_ context.Context, req *cp.CacheRequest) (*cp.CacheReply, error) {
	w := a.cfg.Worker
	rep := &cp.CacheReply{WorkerID: a.cfg.WorkerID, Kind: cp.KindPrefill, Model: a.cfg.ModelID,
		CacheDType: strings.ToLower(w.LatentDType().String())}
	if req.WorkerID != a.cfg.WorkerID {
		rep.SetError(cp.CodeBadRequest, fmt.Sprintf("prefill worker %s: the cache request is addressed to %s", a.cfg.WorkerID, req.WorkerID))
		return rep, nil
	}
	st := w.Store()
	if st == nil {
		rep.Off = true
		return rep, nil
	}
	if req.Op == cp.CacheDrop {
		rep.Dropped = st.Drop(req.Key) // "" with All: every entry
		a.log.Info("prefix store entries dropped on request", zap.String("key", req.Key), zap.Int("dropped", rep.Dropped))
		a.life.Beat()
	}
	s := st.Stats()
	rep.Total, rep.Bytes = s.Entries, s.Bytes
	if req.Op == cp.CacheList {
		rep.Entries = storeEntries(st.List())
		rep.Total = max(rep.Total, len(rep.Entries))
	}
	return rep, nil
}

// storeEntries lists the store's entries as the protocol does, the most
// recently used first, at most cp.MaxCacheEntries.
func storeEntries(in []prefixstore.Info) []cp.CacheEntry {
	out := make([]cp.CacheEntry, 0, min(len(in), cp.MaxCacheEntries))
	for _, e := range in[:min(len(in), cp.MaxCacheEntries)] {
		out = append(out, cp.CacheEntry{Key: e.Key, Prefix: fmt.Sprintf("%016x", uint64(e.Link)), Tokens: e.Tokens,
			Bytes: e.Bytes, LastUse: e.LastUse})
	}
	return out
}
