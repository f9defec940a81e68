package rank

import (
	"fmt"

	"github.com/tandem-inference/tandem/model"
)

// StateBytes is the memory one sequence's state takes on layers [lo, hi)
// when it holds capacity cached tokens: the MLA latent rows grow with the
// tokens, the KDA state and conv tails do not.
func StateBytes(c *model.Config, lo, hi, capacity int, latent model.DType) int64 {
	var n int64
	for L := lo; L < hi; L++ {
		for _, p := range c.ExpectedParts(L, capacity, latent) {
			n += int64(p.Elems()) * int64(p.DType.Size())
		}
	}
	return n
}

// Budget is a rank's memory accounting for sequence state: reservations are
// made at admission for the whole capacity a sequence may reach, so that a
// running sequence never runs out. It is not safe for concurrent use (the
// rank's loop owns it).
type Budget struct {
	limit int64 // 0: unlimited
	used  int64
}

// NewBudget returns a budget of limit bytes; 0 means unlimited.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// ErrNoMemory is wrapped by a refused reservation.
var ErrNoMemory = fmt.Errorf("sequence state does not fit the rank's memory budget")

// Reserve takes n bytes, or refuses with the numbers an operator needs.
func (b *Budget) Reserve(n int64) error {
	if n < 0 {
		return fmt.Errorf("negative reservation %d", n)
	}
	if b.limit > 0 && b.used+n > b.limit {
		return fmt.Errorf("%w: needs %s, %s of %s free", ErrNoMemory, Bytes(n), Bytes(b.limit-b.used), Bytes(b.limit))
	}
	b.used += n
	return nil
}

// Release returns n reserved bytes.
func (b *Budget) Release(n int64) {
	b.used = max(b.used-n, 0)
}

// Used and Limit report the accounting.
func (b *Budget) Used() int64  { return b.used }
func (b *Budget) Limit() int64 { return b.limit }

// Bytes formats a byte count for messages.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
