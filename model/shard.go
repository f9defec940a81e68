package model

import (
	"context"
	"fmt"
	"sync"

	"github.com/tandem-inference/tandem/kernels"
)

// Tensor- and expert-parallel decode splits every layer of a pipeline
// stage over the stage's ranks. Rank t of T holds:
//
//   - KDA: a contiguous range of H/T heads: the rows of q/k/v/g_proj,
//     f_b_proj and b_proj for their channels, their conv weights, A_log and
//     dt_bias entries, and their recurrent state and conv tails; f_a_proj
//     and o_norm are replicated; the columns of o_proj for those channels
//     give a partial output.
//   - MLA: a range of H/T query heads: the rows of q_b_proj, kv_b_proj and
//     g_proj, and the o_proj columns (a partial output); q_a/kv_a and their
//     norms are replicated, and so is the latent cache (every head reads
//     all of it, and a row is only 1,152 bytes per token in K3).
//   - Stable LatentMoE: the router and the latent down projection are
//     replicated (every expert reads the whole latent z, and the router
//     gives the same bits on every rank from the same inputs); the routed
//     experts are partitioned by id, and each rank sums its own experts'
//     weighted outputs u_t in the latent width; the shared expert is split
//     along its intermediate width. The block's one reduction carries u_t
//     and the shared partial together; after it every rank holds the whole
//     u and shared output, and runs the aggregate latent norm and the
//     latent up projection replicated. The norm needs the whole u, so
//     splitting the up projection would cost a third reduction per layer
//     for a matrix of d x latent, small beside the experts.
//   - The dense FFN: its intermediate width split; a partial output.
//   - AttnRes, norms and the embedding: replicated. The lm_head is
//     vocab-parallel: each rank computes the logits of its vocabulary range.
//
// So a layer costs two reductions (attention block, MLP block). The
// Reducer sums in rank order and every rank ends with the same bits, so the
// ranks' activations stay identical and a run is reproducible. The only
// difference from the unsplit layer is the order of the sums the split
// cuts (o_proj's, the experts' mixture, down_proj's), within fp32 rounding.

// Shard is one tensor-parallel rank of a stage: rank Rank of Ranks. The
// zero Shard (and Ranks 1) is the unsplit model.
type Shard struct{ Rank, Ranks int }

// Split reports whether the layer is cut over more than one rank.
func (s Shard) Split() bool { return s.Ranks > 1 }

// Range returns this rank's contiguous part [lo, hi) of n units: balanced,
// the parts of the ranks in rank order covering [0, n).
func (s Shard) Range(n int) (lo, hi int) {
	if !s.Split() {
		return 0, n
	}
	return n * s.Rank / s.Ranks, n * (s.Rank + 1) / s.Ranks
}

func (s Shard) String() string { return fmt.Sprintf("tensor rank %d of %d", s.Rank, s.Ranks) }

// CheckShard says whether layers of c can be split over ranks tensor ranks:
// the KDA and MLA heads must divide evenly (each rank runs the same kernels
// on the same number of heads, and the state slices are equal), and every
// rank needs at least one routed expert and one unit of each split width.
// Experts and FFN widths may split unevenly (by at most one unit), so that
// 3 ranks can share 512 experts.
func (c *Config) CheckShard(ranks int) error {
	if ranks < 1 {
		return fmt.Errorf("tensor ranks %d: want 1 or more", ranks)
	}
	if ranks == 1 {
		return nil
	}
	if c.KDAHeads%ranks != 0 {
		return fmt.Errorf("tensor %d does not divide the model's %d KDA heads: pick a tensor size that divides %d", ranks, c.KDAHeads, c.KDAHeads)
	}
	if c.MLAHeads%ranks != 0 {
		return fmt.Errorf("tensor %d does not divide the model's %d MLA heads: pick a tensor size that divides %d", ranks, c.MLAHeads, c.MLAHeads)
	}
	if c.NumExperts < ranks {
		return fmt.Errorf("tensor %d is more ranks than the model's %d routed experts", ranks, c.NumExperts)
	}
	if c.VocabSize < ranks || c.IntermediateSize < ranks {
		return fmt.Errorf("tensor %d is more ranks than the model's vocabulary or FFN width", ranks)
	}
	if c.NumShared > 0 && c.SharedWidth() < ranks {
		return fmt.Errorf("tensor %d is more ranks than the shared experts' width %d", ranks, c.SharedWidth())
	}
	return nil
}

// Reducer sums a buffer element-wise over the ranks of a stage, in rank
// order, accumulated in float64 and rounded once, replacing every rank's
// buffer with the same bits (collective.Group is one). Every rank calls it
// with buffers of the same length, the same number of times, in the same
// order.
type Reducer interface {
	AllReduce(ctx context.Context, buf []float32) error
}

// split reports whether m is one rank of a split stage.
func (m *Model) split() bool { return m.Shard.Split() }

// reduce sums tensors over the stage's ranks in place, packed into one
// host buffer: one exchange however many tensors.
func (m *Model) reduce(ctx context.Context, ts ...*kernels.Tensor) error {
	if m.Reduce == nil {
		return fmt.Errorf("model: %s has no reducer for its partial sums", m.Shard)
	}
	n := 0
	for _, t := range ts {
		n += t.Rows * t.Cols
	}
	p := reduceBufs.Get().(*[]float32)
	defer reduceBufs.Put(p)
	if cap(*p) < n {
		*p = make([]float32, n)
	}
	buf := (*p)[:n]
	off := 0
	for _, t := range ts {
		k := t.Rows * t.Cols
		m.Backend.Download(buf[off:off+k], t)
		off += k
	}
	if err := m.Reduce.AllReduce(ctx, buf); err != nil {
		return fmt.Errorf("model: %s: reduction: %w", m.Shard, err)
	}
	off = 0
	for _, t := range ts {
		k := t.Rows * t.Cols
		m.Backend.Upload(t, buf[off:off+k])
		off += k
	}
	return nil
}

var reduceBufs = sync.Pool{New: func() any { return new([]float32) }}

// gatherLogits fills flat [n, vocab] with every rank's logits [n, its
// range] from the vocab-parallel lm_head: each rank places its range among
// zeros and the reduction adds them, which is exact (x + 0 = x), so every
// rank gets the unsplit head's logits bit for bit.
func (m *Model) gatherLogits(flat []float32, local *kernels.Tensor) error {
	v, lo, w := m.Cfg.VocabSize, m.Globals.VocabBase, local.Cols
	part := make([]float32, local.Rows*w)
	m.Backend.Download(part, local)
	for r := 0; r < local.Rows; r++ {
		copy(flat[r*v+lo:r*v+lo+w], part[r*w:(r+1)*w])
	}
	if m.Reduce == nil {
		return fmt.Errorf("model: %s has no reducer for its logits", m.Shard)
	}
	if err := m.Reduce.AllReduce(context.Background(), flat); err != nil {
		return fmt.Errorf("model: %s: gathering the logits: %w", m.Shard, err)
	}
	return nil
}
