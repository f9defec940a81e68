package sim

import (
	"time"

	"github.com/tandem-inference/tandem/model"
)

// FLOPs is the work of one layer over some tokens, split by layer type: the
// attention sublayer (KDA, or MLA's projections and its causal attention
// over the cache, Attn, which grows with the context) and the feed-forward
// sublayer (MoE or dense). A multiply-add counts as two.
type FLOPs struct {
	KDA, MLA, Attn, MoE, Dense float64
}

// Add returns f + g.
func (f FLOPs) Add(g FLOPs) FLOPs {
	return FLOPs{f.KDA + g.KDA, f.MLA + g.MLA, f.Attn + g.Attn, f.MoE + g.MoE, f.Dense + g.Dense}
}

// Total is the sum over types.
func (f FLOPs) Total() float64 { return f.KDA + f.MLA + f.Attn + f.MoE + f.Dense }

// Time is how long f takes at the given rates.
func (f FLOPs) Time(c Compute) time.Duration {
	s := f.KDA/c.KDA + f.MLA/c.MLA + f.Attn/c.attention() + f.MoE/c.MoE + f.Dense/c.Dense
	return seconds(s / 1e9)
}

// LayerFLOPs counts the work of layer L over the positions [lo, hi) of one
// sequence (the earlier positions are in its cache). Every projection is a
// GEMM of 2·in·out per token. KDA adds its chunked recurrence per head and
// token: about 4·C·D for the intra-chunk attention and 6·D² for reading and
// updating the D×D state (C the chunk, D the head size). MLA adds the causal
// attention: per head, 2·(q·k width + v width) for every (query, earlier or
// same key) pair. The MoE counts the router, the latent down and up
// projections, the shared experts and top-k routed experts (gate, up, down).
// AttnRes mixes and norms are a few d-wide vectors per token and are left
// out.
func LayerFLOPs(c *model.Config, L, lo, hi int) FLOPs {
	var f FLOPs
	if hi <= lo {
		return f
	}
	n := float64(hi - lo)
	d := float64(c.HiddenSize)
	switch c.LayerKind(L) {
	case model.KDA:
		P, D, H := float64(c.KDAProjDim()), float64(c.KDAHeadDim), float64(c.KDAHeads)
		params := 5*P*d + D*d + P*D + H*d // q, k, v, g, o; f_a, f_b; b
		f.KDA = 2*params*n + H*n*(4*float64(model.KDAChunk)*D+6*D*D)
	case model.MLA:
		H := float64(c.MLAHeads)
		qw, kvw, ow := H*float64(c.QHeadDim()), H*float64(c.QKNopeDim+c.VHeadDim), H*float64(c.VHeadDim)
		q, kv, lat := float64(c.QLoraRank), float64(c.KVLoraRank), float64(c.LatentWidth())
		params := q*d + qw*q + lat*d + kvw*kv + ow*d + d*ow // q_a, q_b, kv_a, kv_b, g, o
		pairs := (float64(hi)*float64(hi+1) - float64(lo)*float64(lo+1)) / 2
		f.MLA = 2 * params * n
		f.Attn = 2 * H * float64(c.QHeadDim()+c.VHeadDim) * pairs
	}
	if c.IsDense(L) {
		f.Dense = 2 * n * 3 * d * float64(c.IntermediateSize)
		return f
	}
	E, lat, mi := float64(c.NumExperts), float64(c.LatentDim), float64(c.MoEIntermediate)
	params := E*d + 2*lat*d + 3*d*float64(c.SharedWidth()) + float64(c.TopK)*3*lat*mi
	f.MoE = 2 * n * params
	return f
}

// PromptFLOPs is the work of every layer over positions [lo, hi).
func PromptFLOPs(c *model.Config, lo, hi int) FLOPs {
	var f FLOPs
	for L := 0; L < c.NumLayers; L++ {
		f = f.Add(LayerFLOPs(c, L, lo, hi))
	}
	return f
}

// seconds converts, saturating far beyond any simulated time.
func seconds(s float64) time.Duration {
	if !(s < 1e9) {
		return time.Duration(1e9 * float64(time.Second))
	}
	return time.Duration(s * float64(time.Second))
}
