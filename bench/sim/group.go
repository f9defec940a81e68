package sim

import (
	"time"

	"github.com/tandem-inference/tandem/costmodel"
)

// groupCost prices the decode group's own prefill, chunk by chunk, with
// the cost model's terms (costmodel.Compute): the profile's compute rates
// per layer type and fixed cost per layer, or, from measured rate points,
// the rates that give a token at context position p a cost of a + b·p
// seconds (attention grows with the context), fitted through the points.
type groupCost struct {
	rates costmodel.Compute
	model *Model
}

func newGroupCost(g *DecodeGroup, m *Model) groupCost {
	return groupCost{rates: groupRates(g, m), model: m}
}

// groupRates is the decode group's own prefill as the cost model's terms.
func groupRates(g *DecodeGroup, m *Model) costmodel.Compute {
	if g.Compute != nil {
		return withOverhead(*g.Compute, g.LayerOverheadMS)
	}
	a, b := fitRate(g.PrefillRate)
	// a seconds per token of linear work, b per token and position of
	// attention: the rates per term that cost the same.
	lin := m.Cost.Work(0, 1)
	lin.Attn = 0
	perPair := m.Cost.Work(0, 2).Attn - m.Cost.Work(0, 1).Attn // one MLA pair's work over every layer, x2
	r := costmodel.Uniform(lin.Total()/1e9/positive(a), 0)
	r.MLAAttention = 1e12 // no attention cost measured: effectively free
	if b > 0 && perPair > 0 && a > b {
		// The cost model's attention counts a token's own key (p+1
		// pairs at position p): b of each token's a moves there.
		r = costmodel.Uniform(lin.Total()/1e9/(a-b), 0)
		r.MLAAttention = perPair / 2 / 1e9 / b
	}
	return r
}

func positive(v float64) float64 {
	if v > 0 {
		return v
	}
	return 1e-300
}

// fitRate fits 1/rate = a + b·(T-1)/2 (the average per-token cost over a
// prompt of T tokens whose token at position p costs a + b·p) by least
// squares, keeping both terms non-negative.
func fitRate(ps []RatePoint) (a, b float64) {
	var n, sx, sy, sxx, sxy float64
	for _, p := range ps {
		x, y := float64(p.Tokens-1)/2, 1/p.TokPerS
		n++
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	if den := n*sxx - sx*sx; n > 1 && den > 0 {
		b = (n*sxy - sx*sy) / den
		a = (sy - b*sx) / n
	}
	switch {
	case b <= 0 || n < 2: // flat: the mean cost
		return sy / n, 0
	case a < 0: // through the origin
		return 0, sxy / sxx
	}
	return a, b
}

// Chunk is the time to prefill positions [lo, hi) of a prompt.
func (c groupCost) Chunk(lo, hi int) time.Duration {
	if hi <= lo {
		return 0
	}
	return c.rates.Time(c.model.Cost.Work(lo, hi), c.model.Cost.Layers)
}

// Attention is the part of Chunk(lo, hi) in the MLA attention.
func (c groupCost) Attention(lo, hi int) time.Duration {
	if hi <= lo {
		return 0
	}
	return costmodel.FLOPs{Attn: c.model.Cost.Work(lo, hi).Attn}.Time(c.rates)
}

// groupPiece is one prompt's chunk in a prefill step of the group.
type groupPiece struct {
	j      *simJob
	lo, hi int
}

// Step is the time of one prefill step carrying several prompts' chunks:
// their work together, and one fixed cost per layer.
func (c groupCost) Step(ps []groupPiece) time.Duration {
	var f costmodel.FLOPs
	for _, p := range ps {
		f = f.Add(c.model.Cost.Work(p.lo, p.hi))
	}
	if f.Total() == 0 {
		return 0
	}
	return c.rates.Time(f, c.model.Cost.Layers)
}

// Prefill is the time to prefill tokens positions in chunks of chunk.
func (c groupCost) Prefill(tokens, chunk int) time.Duration {
	var d time.Duration
	for lo := 0; lo < tokens; lo += chunk {
		d += c.Chunk(lo, min(tokens, lo+chunk))
	}
	return d
}
