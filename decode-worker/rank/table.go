package rank

import (
	"fmt"
	"time"

	"github.com/tandem-inference/tandem/model"
)

// Entry is one sequence on this rank: its reservation and, once created
// (local prefill) or committed (remote prefill), its state for the rank's
// layers.
type Entry struct {
	ID       string
	Capacity int   // tokens the state may reach
	Reserved int64 // bytes reserved for it
	State    *model.SeqState
	Admitted time.Time
}

// Table is the rank's sequence table with its memory accounting. It is not
// safe for concurrent use: the rank's loop owns it.
type Table struct {
	cfg    *model.Config
	lo, hi int
	opt    model.StateOptions
	budget *Budget
	seqs   map[string]*Entry
}

// NewTable returns an empty table for layers [lo, hi) of cfg, holding at most
// budget bytes of state (0: unlimited), with states stored as opt says.
func NewTable(cfg *model.Config, lo, hi int, budget int64, opt model.StateOptions) *Table {
	if opt.LatentDType == 0 {
		opt.LatentDType = model.BF16
	}
	return &Table{cfg: cfg, lo: lo, hi: hi, opt: opt, budget: NewBudget(budget), seqs: map[string]*Entry{}}
}

// Admit reserves the memory of a sequence that may reach capacity tokens,
// or refuses with the reason. The state is not allocated yet.
func (t *Table) Admit(id string, capacity int) (*Entry, error) {
	if _, dup := t.seqs[id]; dup {
		return nil, fmt.Errorf("sequence %q is already on this rank", id)
	}
	if capacity < 1 {
		return nil, fmt.Errorf("sequence %q: capacity of %d tokens", id, capacity)
	}
	n := t.Bytes(capacity)
	if err := t.budget.Reserve(n); err != nil {
		return nil, fmt.Errorf("%d tokens on layers [%d, %d): %w", capacity, t.lo, t.hi, err)
	}
	e := &Entry{ID: id, Capacity: capacity, Reserved: n, Admitted: time.Now()}
	t.seqs[id] = e
	return e, nil
}

// Bytes is what a sequence of capacity tokens reserves on this rank.
func (t *Table) Bytes(capacity int) int64 {
	return ShardStateBytes(t.cfg, t.lo, t.hi, capacity, t.opt.LatentDType, t.opt.Shard)
}

// Create gives an admitted sequence a fresh, empty state (local prefill),
// with room for its capacity so that decode never copies the cache.
func (t *Table) Create(e *Entry) {
	opt := t.opt
	opt.LatentCapacity = e.Capacity
	e.State = t.cfg.NewSeqState(t.lo, t.hi, opt)
}

// Install gives an admitted sequence a committed remote state after
// checking it (VerifyShard: a tensor rank takes its slice only); a state
// that fails is not installed.
func (t *Table) Install(e *Entry, st *model.SeqState, tokens int) error {
	if err := VerifyShard(t.cfg, st, t.lo, t.hi, tokens, t.opt.LatentDType, t.opt.Shard); err != nil {
		if t.opt.Shard.Split() {
			return fmt.Errorf("%s of layers [%d, %d): %w", t.opt.Shard, t.lo, t.hi, err)
		}
		return err
	}
	e.State = st
	return nil
}

// Get returns the sequence's entry, or nil.
func (t *Table) Get(id string) *Entry { return t.seqs[id] }

// Free drops the sequence and releases its reservation. It reports whether
// the sequence was there.
func (t *Table) Free(id string) bool {
	e := t.seqs[id]
	if e == nil {
		return false
	}
	delete(t.seqs, id)
	e.State = nil
	t.budget.Release(e.Reserved)
	return true
}

// IDs lists the sequences on the rank, in no particular order.
func (t *Table) IDs() []string {
	out := make([]string, 0, len(t.seqs))
	for id := range t.seqs {
		out = append(out, id)
	}
	return out
}

// Budget is the table's memory accounting, which the rank's prefix cache
// shares: cached states count against the same bytes as sequences.
func (t *Table) Budget() *Budget { return t.budget }

// Reserved is what the table's sequences hold of the budget.
func (t *Table) Reserved() int64 {
	var n int64
	for _, e := range t.seqs {
		n += e.Reserved
	}
	return n
}

// Len is the number of sequences; Used and Limit the reserved and budgeted bytes.
func (t *Table) Len() int             { return len(t.seqs) }
func (t *Table) Used() int64          { return t.budget.Used() }
func (t *Table) Limit() int64         { return t.budget.Limit() }
func (t *Table) Layers() (lo, hi int) { return t.lo, t.hi }
