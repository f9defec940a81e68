package model

import "fmt"

// ShardLayerState returns tensor rank s's slice of layer L's unsplit state:
// for KDA the recurrent state and conv tails of its heads (contiguous rows:
// S is [H, D, D], a tail [H·D, K-1]), copied; for MLA a copy of the whole
// latent cache, which every rank of the stage holds. It is what a rank
// receives of a remotely prefilled sequence.
func (c *Config) ShardLayerState(ls *LayerState, s Shard) (*LayerState, error) {
	if !s.Split() || ls.Kind != KDA {
		return ls.Clone(), nil
	}
	if c.KDAHeads%s.Ranks != 0 {
		return nil, fmt.Errorf("state: layer %d: tensor %d does not divide %d KDA heads", ls.Layer, s.Ranks, c.KDAHeads)
	}
	h0, h1 := s.Range(c.KDAHeads)
	D := c.KDAHeadDim
	out := &LayerState{Layer: ls.Layer, Kind: ls.Kind, Parts: make([]Part, len(ls.Parts))}
	for i, p := range ls.Parts {
		rows, lo, hi := p.Shape[0], h0*D, h1*D // conv tails: channel rows
		if p.Kind == PartKDAState {
			lo, hi = h0, h1 // S: head rows
		}
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
