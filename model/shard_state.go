package model

import (
	"fmt"
	"slices"
)

// ShardRows returns the rows [lo, hi) of a KDA part of kind that tensor
// rank s holds: head rows of the recurrent state S ([H, D, D]), channel
// rows of a conv tail ([H·D, K-1]). Both are contiguous, so a rank's
// slice is one byte range of the unsplit part. It assumes the ranks
// divide the KDA heads (CheckShard).
func (c *Config) ShardRows(kind PartKind, s Shard) (lo, hi int) {
	h0, h1 := s.Range(c.KDAHeads)
	if kind == PartKDAState {
		return h0, h1
	}
	return h0 * c.KDAHeadDim, h1 * c.KDAHeadDim
}

// ShardSpan is tensor rank s's share of a part of kind with the given
// shape and size in bytes: the byte range [off, off+n) of the unsplit part
// and the shape of that range. A KDA part is cut to its rows (ShardRows);
// the MLA cache, which every rank of the stage holds, is whole, and so is
// every part when s is not split.
func (c *Config) ShardSpan(kind PartKind, shape []int, size int, s Shard) (off, n int, sub []int, err error) {
	if !s.Split() || kind == PartLatent {
		return 0, size, shape, nil
	}
	lo, hi := c.ShardRows(kind, s)
	if len(shape) == 0 || shape[0] == 0 || size%shape[0] != 0 || hi > shape[0] {
		return 0, 0, nil, fmt.Errorf("part %s has shape %v; %s needs its rows [%d, %d)", kind, shape, s, lo, hi)
	}
	rb := size / shape[0]
	return lo * rb, (hi - lo) * rb, append([]int{hi - lo}, shape[1:]...), nil
}

// ShardLayerState returns tensor rank s's slice of layer L's unsplit state
// (ShardSpan of each part), copied. It is what a rank receives of a
// remotely prefilled sequence.
func (c *Config) ShardLayerState(ls *LayerState, s Shard) (*LayerState, error) {
	if s.Split() && c.KDAHeads%s.Ranks != 0 {
		return nil, fmt.Errorf("state: layer %d: tensor %d does not divide %d KDA heads", ls.Layer, s.Ranks, c.KDAHeads)
	}
	out := &LayerState{Layer: ls.Layer, Kind: ls.Kind, Parts: make([]Part, len(ls.Parts))}
	for i, p := range ls.Parts {
		off, n, shape, err := c.ShardSpan(p.Kind, p.Shape, len(p.Data), s)
		if err != nil {
			return nil, fmt.Errorf("state: layer %d: %w", ls.Layer, err)
		}
		out.Parts[i] = Part{Kind: p.Kind, DType: p.DType, Shape: slices.Clone(shape), Data: append([]byte(nil), p.Data[off:off+n]...)}
	}
	return out, nil
}

// ShardSeqState is ShardLayerState over every layer a state holds.
func (c *Config) ShardSeqState(st *SeqState, s Shard) (*SeqState, error) {
	out := &SeqState{Tokens: st.Tokens, Layers: make([]*LayerState, len(st.Layers))}
	for L, ls := range st.Layers {
		if ls == nil {
			continue
		}
		sl, err := c.ShardLayerState(ls, s)
		if err != nil {
			return nil, err
		}
		out.Layers[L] = sl
	}
	return out, nil
}
