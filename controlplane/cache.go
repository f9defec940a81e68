package controlplane

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// WorkerCache is the request subject on which worker id takes a
// CacheRequest and answers a CacheReply: it lists or drops the entries of
// its prefix-state cache (a decode rank) or prefix store (a prefill
// worker). Only the coordinator identity may publish it: listing shows
// what prompts were served, dropping costs every session its shortcut.
func WorkerCache(workerID string) string { return Prefix + ".workers." + workerID + ".cache" }

// Cache operations.
const (
	CacheList = "list"
	CacheDrop = "drop"
)

// MaxCacheEntries bounds the entries one CacheReply lists (the most
// recently used first); Total says how many the worker holds.
const MaxCacheEntries = 4096

// CacheRequest asks a worker to list its cache entries (Op list) or to
// drop one of them (Op drop with Key) or all of them (Op drop with All).
type CacheRequest struct {
	WorkerID string `msgpack:"worker_id" json:"worker_id"`
	Op       string `msgpack:"op" json:"op"`
	Key      string `msgpack:"key,omitempty" json:"key,omitempty"`
	All      bool   `msgpack:"all,omitempty" json:"all,omitempty"`
}

// Validate checks the worker id and that the operation names what it acts
// on: a list names nothing, a drop one entry or all of them, never both
// (a drop request that lost its key must not empty the cache).
func (r *CacheRequest) Validate() error {
	const msg = "CacheRequest"
	if err := CheckID(r.WorkerID); err != nil {
		return fieldErr(msg, "worker_id", "%v", err)
	}
	switch r.Op {
	case CacheList:
		if r.Key != "" || r.All {
			return fieldErr(msg, "key", "a list takes no key and no all")
		}
	case CacheDrop:
		if (r.Key == "") == !r.All {
			return fieldErr(msg, "key", "a drop names one entry (key) or all of them (all), not both and not neither")
		}
		if r.Key != "" {
			if err := CheckID(r.Key); err != nil {
				return fieldErr(msg, "key", "%v", err)
			}
		}
	default:
		return fieldErr(msg, "op", "is %q, want %s or %s", r.Op, CacheList, CacheDrop)
	}
	return nil
}

// CacheEntry is one cached prefix as a worker lists it.
type CacheEntry struct {
	// Key names the entry for a drop: a decode group's entry id (the same
	// on every rank of the group), a prefill worker's file name.
	Key string `msgpack:"key" json:"key"`
	// Prefix is the link of the prefix's hash chain at its last token (16
	// hex digits, internal/prefixkey seeded with the model identity and
	// the cache dtype); empty on a decode rank other than the head, which
	// keeps states but not the tokens they stand for.
	Prefix string `msgpack:"prefix,omitempty" json:"prefix,omitempty"`
	// Tokens is the prefix's length; Snapshots how many positions of it a
	// prompt can resume from (a decode rank's KDA snapshots).
	Tokens    int   `msgpack:"tokens" json:"tokens"`
	Snapshots int   `msgpack:"snapshots,omitempty" json:"snapshots,omitempty"`
	Bytes     int64 `msgpack:"bytes" json:"bytes"`
	// LastUse is when a job last resumed from the entry, or when it was
	// kept.
	LastUse time.Time `msgpack:"last_use" json:"last_use"`
}

// CacheReply answers a CacheRequest: who answers (worker, kind, model
// identity, cache dtype and, on a decode rank, its group and rank), what
// the cache holds after the request (Total entries, Bytes), the entries
// for a list, and how many went for a drop. Off says the worker keeps no
// cache (a decode group with prefix_cache.enabled false, a prefill worker
// without prefix_store.dir).
type CacheReply struct {
	WorkerID   string       `msgpack:"worker_id,omitempty" json:"worker_id,omitempty"`
	Kind       WorkerKind   `msgpack:"kind,omitempty" json:"kind,omitempty"`
	Model      string       `msgpack:"model,omitempty" json:"model,omitempty"`
	CacheDType string       `msgpack:"cache_dtype,omitempty" json:"cache_dtype,omitempty"`
	GroupID    string       `msgpack:"group_id,omitempty" json:"group_id,omitempty"`
	Rank       int          `msgpack:"rank,omitempty" json:"rank,omitempty"`
	Off        bool         `msgpack:"off,omitempty" json:"off,omitempty"`
	Total      int          `msgpack:"total" json:"total"`
	Bytes      int64        `msgpack:"bytes" json:"bytes"`
	Entries    []CacheEntry `msgpack:"entries,omitempty" json:"entries,omitempty"`
	Dropped    int          `msgpack:"dropped,omitempty" json:"dropped,omitempty"`
	Error      string       `msgpack:"error,omitempty" json:"error,omitempty"`
	Code       ErrorCode    `msgpack:"code,omitempty" json:"code,omitempty"`
}

// Validate checks the reply: the coordinator's operator reads it from a
// worker, which is not trusted to be well formed.
func (r *CacheReply) Validate() error {
	const msg = "CacheReply"
	if err := checkReply(msg, r.Error, r.Code); err != nil {
		return err
	}
	if r.Error != "" {
		return nil
	}
	if err := CheckID(r.WorkerID); err != nil {
		return fieldErr(msg, "worker_id", "%v", err)
	}
	switch r.Kind {
	case KindPrefill:
		if r.GroupID != "" || r.Rank != 0 {
			return fieldErr(msg, "group_id", "a prefill worker belongs to no decode group")
		}
	case KindDecode:
		if err := CheckID(r.GroupID); err != nil {
			return fieldErr(msg, "group_id", "%v", err)
		}
		if r.Rank < 0 {
			return fieldErr(msg, "rank", "is %d, must be >= 0", r.Rank)
		}
	default:
		return fieldErr(msg, "kind", "is %q, must be prefill or decode", r.Kind)
	}
	if err := checkText(msg, "model", r.Model, 256); err != nil {
		return err
	}
	switch r.CacheDType {
	case "", "bf16", "f32":
	default:
		return fieldErr(msg, "cache_dtype", "is %q, want bf16 or f32", r.CacheDType)
	}
	switch {
	case r.Total < 0 || r.Bytes < 0 || r.Dropped < 0:
		return fieldErr(msg, "total", "total %d, bytes %d and dropped %d must be >= 0", r.Total, r.Bytes, r.Dropped)
	case len(r.Entries) > MaxCacheEntries:
		return fieldErr(msg, "entries", "holds %d, at most %d allowed", len(r.Entries), MaxCacheEntries)
	case len(r.Entries) > r.Total:
		return fieldErr(msg, "entries", "holds %d, more than total %d", len(r.Entries), r.Total)
	case r.Off && (r.Total != 0 || r.Dropped != 0):
		return fieldErr(msg, "off", "a worker without a cache holds and drops nothing")
	}
	for i := range r.Entries {
		if err := r.Entries[i].validate(msg, fmt.Sprintf("entries[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

func (e *CacheEntry) validate(msg, field string) error {
	if err := CheckID(e.Key); err != nil {
		return fieldErr(msg, field+".key", "%v", err)
	}
	if e.Prefix != "" {
		if len(e.Prefix) != 16 {
			return fieldErr(msg, field+".prefix", "is %q, want 16 hex digits", e.Prefix)
		}
		for i := 0; i < len(e.Prefix); i++ {
			if c := e.Prefix[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return fieldErr(msg, field+".prefix", "is %q, want 16 lower-case hex digits", e.Prefix)
			}
		}
	}
	switch {
	case e.Tokens <= 0 || e.Tokens%64 != 0:
		return fieldErr(msg, field+".tokens", "is %d, want a positive multiple of 64", e.Tokens)
	case e.Snapshots < 0 || e.Snapshots > e.Tokens/64:
		return fieldErr(msg, field+".snapshots", "is %d for %d tokens, want 0 to one per 64 tokens", e.Snapshots, e.Tokens)
	case e.Bytes < 0:
		return fieldErr(msg, field+".bytes", "is %d, must be >= 0", e.Bytes)
	case e.LastUse.IsZero():
		return fieldErr(msg, field+".last_use", "is missing")
	}
	return nil
}

// SetError turns r into an error reply.
func (r *CacheReply) SetError(code ErrorCode, text string) {
	*r = CacheReply{WorkerID: r.WorkerID, Error: text, Code: code}
}

// Err returns the reply's error as a *RemoteError, or nil.
func (r *CacheReply) Err() error { return replyErr(r.Error, r.Code) }

// ListCache asks worker for its cache entries.
func ListCache(ctx context.Context, nc *nats.Conn, worker string) (*CacheReply, error) {
	return cacheRequest(ctx, nc, &CacheRequest{WorkerID: worker, Op: CacheList})
}

// DropCache asks worker to drop its entry key, or every entry when key is
// empty.
func DropCache(ctx context.Context, nc *nats.Conn, worker, key string) (*CacheReply, error) {
	return cacheRequest(ctx, nc, &CacheRequest{WorkerID: worker, Op: CacheDrop, Key: key, All: key == ""})
}

func cacheRequest(ctx context.Context, nc *nats.Conn, req *CacheRequest) (*CacheReply, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	var rep CacheReply
	if err := Request(ctx, nc, WorkerCache(req.WorkerID), req, &rep); err != nil {
		return nil, err
	}
	if err := rep.Err(); err != nil {
		return &rep, err
	}
	if rep.WorkerID != req.WorkerID {
		return &rep, fmt.Errorf("%w: CacheReply on %s: from worker %q", ErrInvalid, WorkerCache(req.WorkerID), rep.WorkerID)
	}
	return &rep, nil
}
