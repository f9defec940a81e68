package rank

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tandem-inference/tandem/model"
)

// StateBytes is the memory one sequence's state takes on layers [lo, hi)
// when it holds capacity cached tokens: the MLA latent rows grow with the
// tokens, the KDA state and conv tails do not.
func StateBytes(c *model.Config, lo, hi, capacity int, latent model.DType) int64 {
	return ShardStateBytes(c, lo, hi, capacity, latent, model.Shard{})
}

// ShardStateBytes is StateBytes on tensor rank s: its KDA heads' state and
// tails, and the whole MLA cache, which every rank of a stage holds.
func ShardStateBytes(c *model.Config, lo, hi, capacity int, latent model.DType, s model.Shard) int64 {
	var n int64
	for L := lo; L < hi; L++ {
		for _, p := range c.ExpectedShardParts(L, capacity, latent, s) {
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

// TensorBytes is the share of a checkpoint tensor of size bytes that
// tensor rank s keeps (model.ShardLayer): all of a replicated tensor, its
// part of one split by heads, width or vocabulary (rounded up), and a
// routed expert's tensors whole on the rank that owns the expert and not at
// all elsewhere.
func TensorBytes(c *model.Config, name string, size int64, s model.Shard) int64 {
	if !s.Split() {
		return size
	}
	part := (size + int64(s.Ranks) - 1) / int64(s.Ranks)
	if name == "language_model.lm_head.weight" {
		return part
	}
	_, rest, ok := strings.Cut(name, "language_model.model.layers.")
	if !ok {
		return size
	}
	_, rest, _ = strings.Cut(rest, ".")
	if e, ok := expertOf(rest); ok {
		if lo, hi := s.Range(c.NumExperts); e >= lo && e < hi {
			return size
		}
		return 0
	}
	switch {
	case strings.HasPrefix(rest, "mlp."), strings.HasPrefix(rest, "block_sparse_moe.shared_experts."):
		return part
	case strings.HasPrefix(rest, "self_attn."):
		for _, r := range replicatedAttn {
			if strings.HasPrefix(rest, "self_attn."+r) {
				return size
			}
		}
		return part
	}
	return size
}

// replicatedAttn are the attention tensors every tensor rank holds whole.
var replicatedAttn = []string{"f_a_proj.", "o_norm.", "q_a_proj.", "q_a_layernorm.", "kv_a_proj_with_mqa.", "kv_a_layernorm."}

// expertOf reads the routed expert id of a layer tensor's name after the
// layer number ("block_sparse_moe.experts.E.w1.weight_packed").
func expertOf(rest string) (int, bool) {
	rest, ok := strings.CutPrefix(rest, "block_sparse_moe.experts.")
	if !ok {
		return 0, false
	}
	num, _, _ := strings.Cut(rest, ".")
	e, err := strconv.Atoi(num)
	return e, err == nil
}
