package sim

import (
	"time"
)

// groupCost prices the decode group's own prefill, chunk by chunk. With
// measured rate points, a token at context position p costs a + b·p seconds
// (attention grows with the context), fitted through the points; with
// compute rates, a chunk costs its FLOPs layer by layer, as on a prefill
// box, plus a fixed cost per layer.
type groupCost struct {
	a, b     float64
	compute  *Compute
	overhead time.Duration
	model    *Model
}

func newGroupCost(g *DecodeGroup, m *Model) groupCost {
	c := groupCost{compute: g.Compute, overhead: seconds(g.LayerOverheadMS / 1e3), model: m}
	if g.Compute == nil {
		c.a, c.b = fitRate(g.PrefillRate)
	}
	return c
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
	if c.compute != nil {
		return PromptFLOPs(c.model.Cfg, lo, hi).Time(*c.compute) + time.Duration(len(c.model.Layers))*c.overhead
	}
	n := float64(hi - lo)
	pos := (float64(hi)*float64(hi-1) - float64(lo)*float64(lo-1)) / 2 // sum of positions lo..hi-1
	return seconds(c.a*n + c.b*pos)
}

// groupPiece is one prompt's chunk in a prefill step of the group.
type groupPiece struct {
	j      *simJob
	lo, hi int
}

// Step is the time of one prefill step carrying several prompts' chunks:
// their work together, and with compute rates one fixed cost per layer.
func (c groupCost) Step(ps []groupPiece) time.Duration {
	if c.compute == nil {
		var d time.Duration
		for _, p := range ps {
			d += c.Chunk(p.lo, p.hi)
		}
		return d
	}
	var f FLOPs
	for _, p := range ps {
		if p.hi > p.lo {
			f = f.Add(PromptFLOPs(c.model.Cfg, p.lo, p.hi))
		}
	}
	return f.Time(*c.compute) + time.Duration(len(c.model.Layers))*c.overhead
}

// Prefill is the time to prefill tokens positions in chunks of chunk.
func (c groupCost) Prefill(tokens, chunk int) time.Duration {
	var d time.Duration
	for lo := 0; lo < tokens; lo += chunk {
		d += c.Chunk(lo, min(tokens, lo+chunk))
	}
	return d
}
