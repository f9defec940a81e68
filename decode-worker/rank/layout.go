// Package rank is one decode rank's resident share of the model: its place
// in the group layout, its layer range's weights, the sequence table that
// holds each sequence's per-layer state, and the memory accounting that
// admits a sequence only if its state fits.
package rank

import (
	"fmt"
	"net"

	"github.com/tandem-inference/tandem/model"
)

// Layout is a decode group: pipeline stages in order, each owning a
// contiguous layer range, and Tensor ranks per stage that split each of
// the stage's layers between them (model.Shard). Ranks are numbered
// stage-major: rank = stage·Tensor + t. The first stage's ranks also hold
// the embedding; the last stage's ranks the final AttnRes mix, norm and
// their vocabulary range of the lm_head: they gather the logits and draw
// alike, and the group's last rank sends the tokens to rank 0. Tensor 1
// (or 0) is the plain pipeline: one rank per stage.
type Layout struct {
	// Group names the group (it prefixes the mesh channel ids).
	Group string
	Ranks []Spec
	// Tensor is the number of ranks per stage (0 counts as 1).
	Tensor int
}

// TensorRanks is the number of ranks per stage, at least 1.
func (l *Layout) TensorRanks() int { return max(l.Tensor, 1) }

// Stages is the number of pipeline stages.
func (l *Layout) Stages() int { return len(l.Ranks) / l.TensorRanks() }

// StageOf returns rank r's stage and its tensor rank within the stage.
func (l *Layout) StageOf(r int) (stage, t int) { return r / l.TensorRanks(), r % l.TensorRanks() }

// RankOf is the rank of tensor rank t of stage s.
func (l *Layout) RankOf(stage, t int) int { return stage*l.TensorRanks() + t }

// Shard is rank r's model.Shard: its tensor rank within its stage.
func (l *Layout) Shard(r int) model.Shard {
	_, t := l.StageOf(r)
	return model.Shard{Rank: t, Ranks: l.TensorRanks()}
}

// HoldsEmbed and HoldsHead report whether rank r holds the embedding (the
// first stage) and the final mix and lm_head (the last stage).
func (l *Layout) HoldsEmbed(r int) bool { s, _ := l.StageOf(r); return s == 0 }
func (l *Layout) HoldsHead(r int) bool  { s, _ := l.StageOf(r); return s == l.Stages()-1 }

// Spec is one rank of a layout.
type Spec struct {
	// Endpoint is the rank's kvtransfer server ("host:port"): it receives
	// remote-prefilled state and the mesh channel from the previous rank.
	Endpoint string
	// Layers [Lo, Hi) are resident on the rank.
	Lo, Hi int
	// MemoryBudget bounds the bytes of sequence state the rank holds; 0
	// takes the worker's default.
	MemoryBudget int64
}

// Last is the index of the last rank.
func (l *Layout) Last() int { return len(l.Ranks) - 1 }

// Owner returns the rank that owns layer L (the first of its stage), or -1.
func (l *Layout) Owner(L int) int {
	for r, s := range l.Ranks {
		if L >= s.Lo && L < s.Hi {
			return r - r%l.TensorRanks()
		}
	}
	return -1
}

// Validate checks the layout against a model of numLayers layers: at least
// one rank, whole stages of Tensor ranks, endpoints that parse and differ,
// the ranks of a stage on the same layers, and stage ranges that tile
// [0, numLayers) in order with at least one layer each.
func (l *Layout) Validate(numLayers int) error {
	if l.Group == "" {
		return fmt.Errorf("decode group layout: no group name")
	}
	if len(l.Ranks) == 0 {
		return fmt.Errorf("decode group %q: no ranks", l.Group)
	}
	T := l.TensorRanks()
	if l.Tensor < 0 || len(l.Ranks)%T != 0 {
		return fmt.Errorf("decode group %q: %d ranks do not make whole stages of tensor %d (the ranks must number pipeline x tensor)", l.Group, len(l.Ranks), l.Tensor)
	}
	seen := map[string]int{}
	next := 0
	for r, s := range l.Ranks {
		if _, _, err := net.SplitHostPort(s.Endpoint); err != nil {
			return fmt.Errorf("decode group %q rank %d: endpoint %q: %w", l.Group, r, s.Endpoint, err)
		}
		if prev, dup := seen[s.Endpoint]; dup {
			return fmt.Errorf("decode group %q: ranks %d and %d share endpoint %s", l.Group, prev, r, s.Endpoint)
		}
		seen[s.Endpoint] = r
		if _, t := l.StageOf(r); t > 0 {
			if first := l.Ranks[r-t]; s.Lo != first.Lo || s.Hi != first.Hi {
				return fmt.Errorf("decode group %q rank %d: layers [%d, %d), but its stage's first rank %d has [%d, %d) (a stage's tensor ranks share its layers)", l.Group, r, s.Lo, s.Hi, r-t, first.Lo, first.Hi)
			}
		} else if s.Lo != next || s.Hi <= s.Lo {
			return fmt.Errorf("decode group %q rank %d: layers [%d, %d) do not continue from layer %d (ranges must tile the layers in rank order, one layer at least)", l.Group, r, s.Lo, s.Hi, next)
		}
		if s.MemoryBudget < 0 {
			return fmt.Errorf("decode group %q rank %d: negative memory budget %d", l.Group, r, s.MemoryBudget)
		}
		next = s.Hi
	}
	if next != numLayers {
		return fmt.Errorf("decode group %q: ranks cover layers [0, %d) but the model has %d", l.Group, next, numLayers)
	}
	return nil
}

// Split gives consecutive runs of numLayers layers to n ranks, as even as
// possible with the extra layers on the first ranks, and returns the
// [lo, hi) of each.
func Split(numLayers, n int) ([][2]int, error) {
	if n < 1 || numLayers < n {
		return nil, fmt.Errorf("cannot split %d layers over %d ranks", numLayers, n)
	}
	out := make([][2]int, n)
	lo := 0
	for r := range out {
		k := numLayers / n
		if r < numLayers%n {
			k++
		}
		out[r] = [2]int{lo, lo + k}
		lo += k
	}
	return out, nil
}

// Even returns a layout over endpoints with layers split by Split.
func Even(group string, numLayers int, endpoints []string) (*Layout, error) {
	return EvenTensor(group, numLayers, endpoints, 1)
}

// EvenTensor returns a layout of len(endpoints)/tensor stages of tensor
// ranks each (endpoints stage-major), the layers split over the stages by
// Split.
func EvenTensor(group string, numLayers int, endpoints []string, tensor int) (*Layout, error) {
	if tensor < 1 || len(endpoints)%tensor != 0 {
		return nil, fmt.Errorf("decode group %q: %d ranks do not make whole stages of tensor %d (the ranks must number pipeline x tensor)", group, len(endpoints), tensor)
	}
	ranges, err := Split(numLayers, len(endpoints)/tensor)
	if err != nil {
		return nil, fmt.Errorf("decode group %q: %w", group, err)
	}
	l := &Layout{Group: group, Tensor: tensor}
	for r, ep := range endpoints {
		lr := ranges[r/tensor]
		l.Ranks = append(l.Ranks, Spec{Endpoint: ep, Lo: lr[0], Hi: lr[1]})
	}
	return l, nil
}

// CheckModel checks that the model's layers split over the layout's
// tensor ranks (heads divisible, model.Config.CheckShard).
func (l *Layout) CheckModel(c *model.Config) error {
	if err := c.CheckShard(l.TensorRanks()); err != nil {
		return fmt.Errorf("decode group %q: %w", l.Group, err)
	}
	return nil
}
