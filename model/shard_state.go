package model

import "fmt"

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

// ShardLayerState returns tensor rank s's slice of layer L's unsplit state:
// for KDA the recurrent state and conv tails of its heads (ShardRows),
// copied; for MLA a copy of the whole latent cache, which every rank of the
// stage holds. It is what a rank receives of a remotely prefilled sequence.
func (c *Config) ShardLayerState(ls *LayerState, s Shard) (*LayerState, error) {
	if !s.Split() || ls.Kind != KDA {
		return ls.Clone(), nil
	}
	if c.KDAHeads%s.Ranks != 0 {
		return nil, fmt.Errorf("state: layer %d: tensor %d does not divide %d KDA heads", ls.Layer, s.Ranks, c.KDAHeads)
	}
	out := &LayerState{Layer: ls.Layer, Kind: ls.Kind, Parts: make([]Part, len(ls.Parts))}
	for i, p := range ls.Parts {
		rows := p.Shape[0]
		lo, hi := c.ShardRows(p.Kind, s)
		if rows == 0 || len(p.Data)%rows != 0 || hi > rows {
			return nil, fmt.Errorf("state: layer %d part %s has shape %v; cannot take rows [%d, %d)", ls.Layer, p.Kind, p.Shape, lo, hi)
		}
		rb := len(p.Data) / rows
		shape := append([]int{hi - lo}, p.Shape[1:]...)
		out.Parts[i] = Part{Kind: p.Kind, DType: p.DType, Shape: shape, Data: append([]byte(nil), p.Data[lo*rb:hi*rb]...)}
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
