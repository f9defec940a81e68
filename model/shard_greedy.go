package model

import (
	"context"
	"fmt"
)

// Greedy returns each sequence's greedy token after the last layer: the
// argmax of its last row's logits, the first index on ties, as
// Argmax(Logits(b)) gives. A tensor rank exchanges only each rank's best
// (value, index) per sequence instead of the logits; that is exact because
// the ranks' vocabulary ranges ascend with the rank, so the first rank
// holding the largest value holds its first index.
func (m *Model) Greedy(ctx context.Context, b *Batch) ([]int32, error) {
	if !m.split() {
		logits, err := m.Logits(b)
		if err != nil {
			return nil, err
		}
		out := make([]int32, len(logits))
		for i, l := range logits {
			out[i] = int32(Argmax(l))
		}
		return out, nil
	}
	rows := make([]int, len(b.Spans))
	for i, sp := range b.Spans {
		rows[i] = sp.Hi - 1
	}
	local, err := m.headOf(b, rows)
	if err != nil {
		return nil, err
	}
	n, w, R := len(rows), local.Cols, m.Shard.Ranks
	if m.Cfg.VocabSize > 1<<24 {
		return nil, fmt.Errorf("model: a vocabulary of %d ids does not fit the float32 candidates' indices", m.Cfg.VocabSize)
	}
	vals := make([]float32, n*w)
	m.Backend.Download(vals, local)
	m.Backend.Free(local)
	// best[(i*R+r)*2 : +2] is rank r's (value, index) for sequence i; the
	// other ranks' slots stay zero, so the sum gathers them exactly.
	best := make([]float32, n*R*2)
	for i := 0; i < n; i++ {
		j := Argmax(vals[i*w : (i+1)*w])
		k := (i*R + m.Shard.Rank) * 2
		best[k], best[k+1] = vals[i*w+j], float32(m.Globals.VocabBase+j)
	}
	if m.Reduce == nil {
		return nil, fmt.Errorf("model: %s has no reducer for its candidates", m.Shard)
	}
	if err := m.Reduce.AllReduce(ctx, best); err != nil {
		return nil, fmt.Errorf("model: %s: gathering the greedy candidates: %w", m.Shard, err)
	}
	out := make([]int32, n)
	for i := range out {
		top := i * R * 2
		for r := 1; r < R; r++ {
			if k := (i*R + r) * 2; best[k] > best[top] {
				top = k
			}
		}
		out[i] = int32(best[top+1])
	}
	return out, nil
}
