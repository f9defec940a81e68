package prefixcache

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/model"
)

// Budget is the rank's memory accounting, shared with its sequence table
// (rank.Budget): cached states and live sequences draw on the same bytes.
type Budget interface {
	Reserve(n int64) error
	Release(n int64)
}

// Config sets up one rank's cache.
type Config struct {
	Model  *model.Config
	Lo, Hi int         // the rank's layers
	DType  model.DType // the MLA cache dtype
	// Salt seeds the hash chain (Salt of the model's identity and DType).
	Salt Hash
	// Hash chains the blocks (default SHA256; tests weaken it to force
	// collisions).
	Hash HashFunc
	// Budget is charged for every byte the cache keeps.
	Budget Budget
	// Index keeps each entry's tokens and hash chain so that Lookup can find
	// it: the head's cache. The other ranks follow the head's decisions and
	// keep only states.
	Index bool
	// Now tells the time entries are used at, for listings (default
	// time.Now).
	Now func() time.Time
}

// Cache is one rank's share of the group's prefix cache. It is not safe for
// concurrent use: the rank's loop owns it.
type Cache struct {
	cfg     Config
	entries map[uint64]*Entry
	index   map[Hash][]uint64 // link at a snapshot position -> entries with a snapshot there
	clock   uint64
	nextID  uint64
	version uint64 // counts changes of the entries (not of their use)
	bytes   int64
	stats   Stats
}

// Entry is one cached prefix on this rank.
type Entry struct {
	ID     uint64
	Len    int     // tokens whose MLA rows are kept: the last snapshot's position
	Tokens []int32 // the prefix (head only)
	chain  []Hash
	rows   []*model.LayerState // the rank's MLA layers, Len rows each
	snaps  []*snapshot         // ascending positions, the last at Len
	bytes  int64
	used   uint64
	usedAt time.Time
}

type snapshot struct {
	pos   int
	kda   []*model.LayerState // the rank's KDA layers
	bytes int64
}

// Positions lists the entry's snapshot positions.
func (e *Entry) Positions() []int {
	out := make([]int, len(e.snaps))
	for i, s := range e.snaps {
		out[i] = s.pos
	}
	return out
}

// Stats counts what the cache did; Bytes and Entries are current.
type Stats struct {
	Entries   int
	Bytes     int64
	Lookups   int64 // head: prompts looked up
	Hits      int64 // head: lookups that found a reusable prefix
	HitTokens int64 // head: tokens taken from the cache instead of prefilled
	Misses    int64 // head: lookups that found none; and restores a rank could not serve
	Evictions int64 // entries dropped to make room
	Inserts   int64
	Skipped   int64 // snapshots or entries not kept for want of memory
	// Head: remote states appended to an entry's rows (Holding found
	// them), and the rows' tokens, not sent again.
	Appends, AppendTokens int64
}

// ErrMissing is wrapped when a rank is asked for an entry or a snapshot it
// does not hold (evicted under memory pressure, or lost with a restart).
var ErrMissing = errors.New("prefix cache entry not on this rank")

// New returns an empty cache.
func New(cfg Config) *Cache {
	if cfg.Hash == nil {
		cfg.Hash = SHA256
	}
	if cfg.DType == 0 {
		cfg.DType = model.BF16
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Cache{cfg: cfg, entries: map[uint64]*Entry{}, index: map[Hash][]uint64{}}
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	s := c.stats
	s.Entries, s.Bytes = len(c.entries), c.bytes
	return s
}

// Bytes is what the cache holds of the budget.
func (c *Cache) Bytes() int64 { return c.bytes }

// NewID names a new entry (the head's decision, carried to the ranks).
func (c *Cache) NewID() uint64 {
	c.nextID++
	return c.nextID
}

// Lookup finds the longest reusable prefix of tokens no longer than limit
// tokens: an entry whose tokens equal tokens[:pos] and that holds a
// snapshot at pos. It returns id 0 when there is none. Only a cache with
// Index can look up.
func (c *Cache) Lookup(tokens []int32, limit int) (id uint64, pos int) {
	c.stats.Lookups++
	limit = min(limit, len(tokens))
	chain := Chain(c.cfg.Hash, c.cfg.Salt, tokens[:limit/Block*Block])
	for i := len(chain) - 1; i >= 0; i-- {
		p := (i + 1) * Block
		if best := c.pick(c.index[chain[i]], tokens[:p], p); best != nil {
			c.stats.Hits++
			c.stats.HitTokens += int64(p)
			return best.ID, p
		}
	}
	c.stats.Misses++
	return 0, 0
}

// pick chooses among the candidates of one link the entry that really
// holds prefix with a snapshot at p (tokens compared: a colliding hash is
// not a hit), the most recently used first and the lowest id on a tie.
func (c *Cache) pick(ids []uint64, prefix []int32, p int) *Entry {
	var best *Entry
	for _, id := range ids {
		e := c.entries[id]
		if e == nil || e.Len < p || e.snapAt(p) == nil || !slices.Equal(e.Tokens[:p], prefix) {
			continue
		}
		if best == nil || e.used > best.used || e.used == best.used && e.ID < best.ID {
			best = e
		}
	}
	return best
}

func (e *Entry) snapAt(p int) *snapshot {
	for _, s := range e.snaps {
		if s.pos == p {
			return s
		}
	}
	return nil
}

// Restore fills a fresh state of the rank's layers (room for pos tokens at
// least) with entry id's prefix of pos tokens, and marks the entry used.
func (c *Cache) Restore(st *model.SeqState, id uint64, pos int) error {
	e := c.entries[id]
	if e == nil {
		c.stats.Misses++
		return fmt.Errorf("%w: entry %d", ErrMissing, id)
	}
	snap := e.snapAt(pos)
	if snap == nil || pos > e.Len {
		c.stats.Misses++
		return fmt.Errorf("%w: entry %d has no snapshot at token %d (it holds %v)", ErrMissing, id, pos, e.Positions())
	}
	if st.Tokens != 0 {
		return fmt.Errorf("prefix cache: restoring into a state that holds %d tokens", st.Tokens)
	}
	for L := c.cfg.Lo; L < c.cfg.Hi; L++ {
		dst := st.Layers[L]
		switch c.cfg.Model.LayerKind(L) {
		case model.MLA:
			src := e.rows[L-c.cfg.Lo].Parts[0]
			p := &dst.Parts[0]
			rowBytes := len(src.Data) / max(src.Shape[0], 1)
			p.Data = append(p.Data[:0], src.Data[:pos*rowBytes]...)
			p.Shape = []int{pos, src.Shape[1]}
		case model.KDA:
			src := snap.kda[L-c.cfg.Lo]
			for i := range dst.Parts {
				copy(dst.Parts[i].Data, src.Parts[i].Data)
			}
		}
	}
	st.Tokens = pos
	c.touch(e)
	return nil
}

// Holding finds an entry whose MLA rows start with prefix (any prefix of an
// entry's rows is reusable: a remote transfer appends to them), the most
// recently used first, and returns its id and the prefix's chain link; id
// 0 when there is none. Only a cache with Index can look up.
func (c *Cache) Holding(prefix []int32) (uint64, Hash) {
	n := len(prefix)
	if n == 0 || n%Block != 0 {
		return 0, 0
	}
	var best *Entry
	for _, e := range c.entries {
		if e.Len < n || len(e.Tokens) < n || !slices.Equal(e.Tokens[:n], prefix) {
			continue
		}
		if best == nil || e.used > best.used || e.used == best.used && e.ID < best.ID {
			best = e
		}
	}
	if best == nil {
		return 0, 0
	}
	c.stats.Appends++
	c.stats.AppendTokens += int64(n)
	return best.ID, best.chain[n/Block-1]
}

// RestoreRows fills a fresh state of the rank's layers with the MLA rows of
// entry id's first pos tokens (the base a remote transfer appends to; the
// KDA states come with the transfer), and marks the entry used. The state
// holds pos tokens of rows but no KDA state until the transfer's arrive.
func (c *Cache) RestoreRows(st *model.SeqState, id uint64, pos int) error {
	e := c.entries[id]
	if e == nil || pos > e.Len {
		c.stats.Misses++
		return fmt.Errorf("%w: entry %d with %d tokens of rows", ErrMissing, id, pos)
	}
	for L := c.cfg.Lo; L < c.cfg.Hi; L++ {
		if c.cfg.Model.LayerKind(L) != model.MLA {
			continue
		}
		src := e.rows[L-c.cfg.Lo].Parts[0]
		p := &st.Layers[L].Parts[0]
		rowBytes := src.Shape[1] * src.DType.Size()
		p.Data = append(p.Data[:0], src.Data[:pos*rowBytes]...)
		p.Shape = []int{pos, src.Shape[1]}
	}
	c.touch(e)
	return nil
}

func (c *Cache) touch(e *Entry) {
	c.clock++
	e.used, e.usedAt = c.clock, c.cfg.Now()
}

// Pending is what a running sequence has kept so far of the entry it will
// become: its snapshots, taken as its prefill reaches the planned
// positions.
type Pending struct {
	ID    uint64
	Plan  []int
	snaps []*snapshot
	// From is the entry and position the sequence resumed from (0: none):
	// an entry whose whole length the sequence used is superseded by it.
	From    uint64
	FromPos int
}

// Taken reports the positions snapshotted so far.
func (p *Pending) Taken() []int {
	out := make([]int, len(p.snaps))
	for i, s := range p.snaps {
		out[i] = s.pos
	}
	return out
}

// Snapshot keeps the KDA states of st if st stands at one of p's planned
// positions. A snapshot that does not fit the budget, even after evicting
// every other entry, is skipped (the entry will be shorter).
func (c *Cache) Snapshot(p *Pending, st *model.SeqState) {
	if p == nil || !slices.Contains(p.Plan, st.Tokens) || len(p.snaps) > 0 && p.snaps[len(p.snaps)-1].pos >= st.Tokens {
		return
	}
	s := &snapshot{pos: st.Tokens, kda: make([]*model.LayerState, c.cfg.Hi-c.cfg.Lo)}
	for L := c.cfg.Lo; L < c.cfg.Hi; L++ {
		if c.cfg.Model.LayerKind(L) == model.KDA {
			s.kda[L-c.cfg.Lo] = st.Layers[L].Clone()
			s.bytes += int64(st.Layers[L].Bytes())
		}
	}
	if !c.reserve(s.bytes, p.From) {
		c.stats.Skipped++
		return
	}
	c.bytes += s.bytes
	p.snaps = append(p.snaps, s)
}

// Abandon releases a pending entry's snapshots (its sequence failed).
func (c *Cache) Abandon(p *Pending) {
	if p == nil {
		return
	}
	for _, s := range p.snaps {
		c.release(s.bytes)
	}
	p.snaps = nil
}

// Insert turns a finished sequence's pending entry into an entry: the MLA
// rows of st up to the last snapshot (copied out of the sequence's larger
// buffers) and the snapshots. prompt is the sequence's prompt (kept only
// with Index). The entry the sequence resumed from is superseded when the
// sequence used all of it: the new entry takes its snapshots and it goes.
// An entry that does not fit is dropped with its snapshots.
func (c *Cache) Insert(p *Pending, st *model.SeqState, prompt []int32) {
	if p == nil || len(p.snaps) == 0 {
		return
	}
	n := p.snaps[len(p.snaps)-1].pos
	if st.Tokens < n || c.cfg.Index && len(prompt) < n {
		c.Abandon(p)
		c.stats.Skipped++
		return
	}
	e := &Entry{ID: p.ID, Len: n, snaps: p.snaps, rows: make([]*model.LayerState, c.cfg.Hi-c.cfg.Lo)}
	for L := c.cfg.Lo; L < c.cfg.Hi; L++ {
		if c.cfg.Model.LayerKind(L) != model.MLA {
			continue
		}
		src := st.Layers[L].Parts[0]
		rowBytes := src.Shape[1] * src.DType.Size()
		part := model.Part{Kind: src.Kind, DType: src.DType, Shape: []int{n, src.Shape[1]},
			Data: slices.Clone(src.Data[:n*rowBytes])}
		e.rows[L-c.cfg.Lo] = &model.LayerState{Layer: L, Kind: model.MLA, Parts: []model.Part{part}}
		e.bytes += int64(len(part.Data))
	}
	if old := c.entries[p.From]; old != nil && p.FromPos == old.Len {
		// The new entry holds all of old's rows: take its snapshots and
		// drop its rows instead of keeping them twice.
		c.unindex(old)
		e.snaps = append(slices.Clone(old.snaps), e.snaps...)
		for _, s := range old.snaps {
			old.bytes -= s.bytes
		}
		old.snaps = nil
		c.drop(old)
	}
	for _, s := range e.snaps {
		e.bytes += s.bytes
	}
	p.snaps = nil
	rowBytes := e.bytes
	for _, s := range e.snaps {
		rowBytes -= s.bytes
	}
	if !c.reserve(rowBytes, e.ID) {
		for _, s := range e.snaps {
			c.release(s.bytes)
		}
		c.stats.Skipped++
		return
	}
	c.bytes += rowBytes
	if c.cfg.Index {
		e.Tokens = slices.Clone(prompt[:n])
		e.chain = Chain(c.cfg.Hash, c.cfg.Salt, e.Tokens)
		for _, s := range e.snaps {
			h := e.chain[s.pos/Block-1]
			c.index[h] = append(c.index[h], e.ID)
		}
	}
	c.entries[e.ID] = e
	c.touch(e)
	c.stats.Inserts++
	c.version++
}

// reserve takes n bytes of the budget, evicting the least recently used
// entries (never keep) until they fit. It reports whether they did.
func (c *Cache) reserve(n int64, keep uint64) bool {
	for {
		if c.cfg.Budget == nil || c.cfg.Budget.Reserve(n) == nil {
			return true
		}
		if _, ok := c.EvictOne(keep); !ok {
			return false
		}
	}
}

func (c *Cache) release(n int64) {
	c.bytes -= n
	if c.cfg.Budget != nil {
		c.cfg.Budget.Release(n)
	}
}

// EvictOne drops the least recently used entry other than keep, to make
// room for a sequence or another entry. It reports the entry's id and
// whether there was one.
func (c *Cache) EvictOne(keep uint64) (uint64, bool) {
	id := Victim(c.entries, keep)
	if id == 0 {
		return 0, false
	}
	c.drop(c.entries[id])
	c.stats.Evictions++
	return id, true
}

// Victim is the eviction rule: the least recently used entry other than
// keep, the lowest id on a tie; 0 when there is none.
func Victim(entries map[uint64]*Entry, keep uint64) uint64 {
	var best *Entry
	for id, e := range entries {
		if id == keep {
			continue
		}
		if best == nil || e.used < best.used || e.used == best.used && e.ID < best.ID {
			best = e
		}
	}
	if best == nil {
		return 0
	}
	return best.ID
}

// Drop removes an entry (an operator's request, or the head's word that
// another rank lost it). It reports whether it was there.
func (c *Cache) Drop(id uint64) bool {
	e := c.entries[id]
	if e == nil {
		return false
	}
	c.drop(e)
	return true
}

func (c *Cache) drop(e *Entry) {
	c.version++
	delete(c.entries, e.ID)
	c.release(e.bytes)
	c.unindex(e)
}

func (c *Cache) unindex(e *Entry) {
	for _, s := range e.snaps {
		if len(e.chain) >= s.pos/Block {
			h := e.chain[s.pos/Block-1]
			c.index[h] = slices.DeleteFunc(c.index[h], func(id uint64) bool { return id == e.ID })
			if len(c.index[h]) == 0 {
				delete(c.index, h)
			}
		}
	}
}

// Clear drops every entry: the group formed a new ring, and the ranks
// could otherwise disagree on what is cached.
func (c *Cache) Clear() {
	for _, e := range c.entries {
		c.drop(e)
	}
}

// Info describes one entry for listings.
type Info struct {
	ID        uint64 `json:"id"`
	Tokens    int    `json:"tokens"`
	Snapshots []int  `json:"snapshots"`
	Bytes     int64  `json:"bytes"`
	LastUsed  uint64 `json:"last_used"` // the cache's use order
	// LastUse is when the entry was kept or last resumed from.
	LastUse time.Time `json:"last_use"`
	// Link is the prefix's chain link at Tokens (0 on a rank without
	// Index, which keeps states but not the tokens they stand for).
	Link Hash `json:"link,omitempty"`
}

// List describes the entries, the most recently used first.
func (c *Cache) List() []Info {
	out := make([]Info, 0, len(c.entries))
	for _, e := range c.entries {
		in := Info{ID: e.ID, Tokens: e.Len, Snapshots: e.Positions(), Bytes: e.bytes, LastUsed: e.used, LastUse: e.usedAt}
		if n := e.Len / Block; n > 0 && len(e.chain) >= n {
			in.Link = e.chain[n-1]
		}
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b Info) int {
		if a.LastUsed != b.LastUsed {
			return int(b.LastUsed) - int(a.LastUsed)
		}
		return int(a.ID) - int(b.ID)
	})
	return out
}

// Version changes whenever an entry comes or goes.
func (c *Cache) Version() uint64 { return c.version }

// Link is a prefix a lookup can resume from: its chain link and length.
type Link struct {
	Hash   Hash
	Tokens int
}

// Salt is the seed of the cache's chain.
func (c *Cache) Salt() Hash { return c.cfg.Salt }

// Links lists the prefixes lookups can resume from (every snapshot of every
// entry), the most recently used entries first, at most max of them; what
// the head advertises so that a router can price a hit. Only a cache with
// Index has them.
func (c *Cache) Links(max int) []Link {
	var out []Link
	for _, in := range c.List() {
		e := c.entries[in.ID]
		for i := len(e.snaps) - 1; i >= 0 && len(out) < max; i-- {
			if p := e.snaps[i].pos; len(e.chain) >= p/Block {
				out = append(out, Link{Hash: e.chain[p/Block-1], Tokens: p})
			}
		}
	}
	return out
}
