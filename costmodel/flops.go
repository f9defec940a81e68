package costmodel

import (
	"time"

	"github.com/tandem-inference/tandem/internal/modelconfig"
)

// KDAChunk is the chunk length of the chunked KDA form (model.KDAChunk; a
// test checks they agree).
const KDAChunk = 64

// FLOPs is the work of one layer over some tokens, split by term: the KDA
// layers' attention sublayer (projections and the chunked recurrence), the
// MLA layers' projections (MLA) and their causal attention over the cached
// rows (Attn, the one term that grows with the context), and the
// feed-forward sublayers (MoE, or Dense for the first dense layers). A
// multiply-add counts as two.
type FLOPs struct {
	KDA, MLA, Attn, MoE, Dense float64
}

// Add returns f + g.
func (f FLOPs) Add(g FLOPs) FLOPs {
	return FLOPs{f.KDA + g.KDA, f.MLA + g.MLA, f.Attn + g.Attn, f.MoE + g.MoE, f.Dense + g.Dense}
}

// Scale returns f with every term multiplied by k.
func (f FLOPs) Scale(k float64) FLOPs {
	return FLOPs{f.KDA * k, f.MLA * k, f.Attn * k, f.MoE * k, f.Dense * k}
}

// Total is the sum over terms.
func (f FLOPs) Total() float64 { return f.KDA + f.MLA + f.Attn + f.MoE + f.Dense }

// Time is how long f takes at the given rates, without fixed costs per
// layer call (Compute.Time adds those).
func (f FLOPs) Time(c Compute) time.Duration {
	return seconds(f.seconds(c))
}

func (f FLOPs) seconds(c Compute) float64 {
	return (f.KDA/c.KDA + f.MLA/c.MLA + f.Attn/c.Attention() + f.MoE/c.MoE + f.Dense/c.Dense) / 1e9
}

// LayerFLOPs counts the work of layer L over the positions [lo, hi) of one
// sequence, whose earlier positions are in its cache. Every projection is a
// GEMM of 2·in·out per token. KDA adds its chunked recurrence per head and
// token, about 4·C·D for the intra-chunk attention and 6·D² for reading and
// updating the D×D state, with C the chunk and D the head size. MLA adds
// the causal attention, per head 2·(q·k width + v width) for every pair of
// a query and an earlier or the same key. The MoE counts the router, the
// latent down and up projections, the shared experts and the top-k routed
// experts' gate, up and down. AttnRes mixes and norms, a few d-wide vectors
// per token, are left out.
func LayerFLOPs(c *modelconfig.Config, L, lo, hi int) FLOPs {
	var f FLOPs
	if hi <= lo {
		return f
	}
	n := float64(hi - lo)
	d := float64(c.HiddenSize)
	switch c.LayerKind(L) {
	case modelconfig.KDA:
		P, D, H := float64(c.KDAProjDim()), float64(c.KDAHeadDim), float64(c.KDAHeads)
		params := 5*P*d + D*d + P*D + H*d // q, k, v, g, o; f_a, f_b; b
		f.KDA = 2*params*n + H*n*(4*float64(KDAChunk)*D+6*D*D)
	case modelconfig.MLA:
		f.MLA = 2 * mlaParams(c) * n
		f.Attn = attnPerPair(c) * pairs(lo, hi)
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

// mlaParams is an MLA layer's projection weights a token goes through:
// q_a, q_b, kv_a, kv_b, the output gate and o.
func mlaParams(c *modelconfig.Config) float64 {
	d, H := float64(c.HiddenSize), float64(c.MLAHeads)
	qw, kvw, ow := H*float64(c.QHeadDim()), H*float64(c.QKNopeDim+c.VHeadDim), H*float64(c.VHeadDim)
	q, kv, lat := float64(c.QLoraRank), float64(c.KVLoraRank), float64(c.LatentWidth())
	return q*d + qw*q + lat*d + kvw*kv + ow*d + d*ow
}

// attnPerPair is one MLA layer's attention work per (query, key) pair.
func attnPerPair(c *modelconfig.Config) float64 {
	return 2 * float64(c.MLAHeads) * float64(c.QHeadDim()+c.VHeadDim)
}

// pairs counts the causal (query, key <= query) pairs of the queries at
// positions [lo, hi).
func pairs(lo, hi int) float64 {
	return (float64(hi)*float64(hi+1) - float64(lo)*float64(lo+1)) / 2
}

// PromptFLOPs is the work of every layer over positions [lo, hi).
func PromptFLOPs(c *modelconfig.Config, lo, hi int) FLOPs {
	var f FLOPs
	for L := 0; L < c.NumLayers; L++ {
		f = f.Add(LayerFLOPs(c, L, lo, hi))
	}
	return f
}

// seconds converts, saturating at Unknown.
func seconds(s float64) time.Duration {
	if !(s < 1e9) {
		return Unknown
	}
	return time.Duration(s * float64(time.Second))
}
