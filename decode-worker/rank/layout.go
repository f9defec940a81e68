// Package rank is one decode rank's resident share of the model: its place
// in the group layout, its layer range's weights, the sequence table that
// holds each sequence's per-layer state, and the memory accounting that
// admits a sequence only if its state fits.
package rank

import (
	"fmt"
	"net"
)

// Layout is a decode group: its ranks in pipeline order, each owning a
// contiguous layer range. Rank 0 also holds the embedding; the last rank the
// final AttnRes mix, norm and lm_head.
type Layout struct {
	// Group names the group (it prefixes the mesh channel ids).
	Group string
	Ranks []Spec
}

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

// Owner returns the rank that owns layer L, or -1.
func (l *Layout) Owner(L int) int {
	for r, s := range l.Ranks {
		if L >= s.Lo && L < s.Hi {
			return r
		}
	}
	return -1
}

// Validate checks the layout against a model of numLayers layers: at least
// one rank, endpoints that parse and differ, and ranges that tile
// [0, numLayers) in rank order with at least one layer each.
func (l *Layout) Validate(numLayers int) error {
	if l.Group == "" {
		return fmt.Errorf("decode group layout: no group name")
	}
	if len(l.Ranks) == 0 {
		return fmt.Errorf("decode group %q: no ranks", l.Group)
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
		if s.Lo != next || s.Hi <= s.Lo {
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
	ranges, err := Split(numLayers, len(endpoints))
	if err != nil {
		return nil, fmt.Errorf("decode group %q: %w", group, err)
	}
	l := &Layout{Group: group}
	for r, ep := range endpoints {
		l.Ranks = append(l.Ranks, Spec{Endpoint: ep, Lo: ranges[r][0], Hi: ranges[r][1]})
	}
	return l, nil
}
