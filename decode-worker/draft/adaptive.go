package draft

import "time"

// Adaptive chooses one sequence's k from its recent acceptance. It
// estimates the per-token acceptance rate a of a geometric model (each
// drafted token accepted with probability a until the first rejection)
// from exponentially decayed counts: accepted tokens over accepted tokens
// plus rejections, the model's maximum-likelihood estimate, starting from
// one success in two trials. k grows by one after a fully accepted draft,
// falls to at most accepted+1 (and at least 1) after a rejection, and is 0
// while the rate is under Floor; after Probe steps at 0 it tries k = 1
// again. It is not safe for concurrent use.
type Adaptive struct {
	kMax, probe  int
	decay, floor float64
	k, idle      int
	s, n         float64
}

// NewAdaptive returns a controller for k in [0, kMax] starting at
// min(2, kMax): decay weighs each earlier step (0.9 remembers about ten
// verifications), floor is the rate under which it stops drafting, and
// probe the steps it waits at k = 0 before trying again. Values out of
// range are clamped: kMax to >= 0, decay and floor to [0, 1], probe to >= 1.
func NewAdaptive(kMax int, decay, floor float64, probe int) *Adaptive {
	kMax = max(kMax, 0)
	return &Adaptive{
		kMax: kMax, probe: max(probe, 1),
		decay: clamp01(decay), floor: clamp01(floor),
		k: min(2, kMax), s: 1, n: 2,
	}
}

func clamp01(x float64) float64 {
	if !(x > 0) { // NaN too
		return 0
	}
	return min(x, 1)
}

// K returns the number of tokens to draft next.
func (a *Adaptive) K() int { return a.k }

// Rate returns the estimated per-token acceptance rate.
func (a *Adaptive) Rate() float64 { return a.s / a.n }

// Observe records a step that drafted tokens and accepted some of them
// (clamped to [0, drafted]); a step that drafted none counts toward a probe.
func (a *Adaptive) Observe(drafted, accepted int) {
	if drafted <= 0 {
		if a.k == 0 && a.kMax > 0 {
			if a.idle++; a.idle >= a.probe {
				a.k, a.idle = 1, 0
			}
		}
		return
	}
	accepted = min(max(accepted, 0), drafted)
	rejected := 0
	if accepted < drafted {
		rejected = 1
	}
	a.s = a.decay*a.s + float64(accepted)
	a.n = a.decay*a.n + float64(accepted+rejected)
	if rejected == 0 {
		a.k = min(max(a.k, drafted)+1, a.kMax)
	} else {
		a.k = max(1, min(a.k-1, accepted+1))
	}
	if a.Rate() < a.floor {
		a.k, a.idle = 0, 0
	}
}

// Plan returns the k to draft now: Best up to K at the current rate.
func (a *Adaptive) Plan(stepCost func(rows int) time.Duration) int {
	return Best(a.k, stepCost, a.Rate())
}

// Expected returns the expected tokens a step emits when it drafts k at
// per-token acceptance rate a: 1 + a + ... + a^k, that is
// (1 - a^(k+1)) / (1 - a), the accepted run of a geometric model plus the
// token every step emits.
func Expected(k int, a float64) float64 {
	a = clamp01(a)
	sum, term := 0.0, 1.0
	for range max(k, 0) + 1 {
		sum += term
		term *= a
	}
	return sum
}

// Worth reports whether drafting k tokens beats plain decoding: whether
// Expected(k, a) tokens per stepCost(k+1) exceed one per stepCost(1).
// stepCost(r) is the cost of a step in which the sequence takes r rows,
// the rest of its batch included. A k below 1 or a cost that is not
// positive is never worth it.
func Worth(k int, stepCost func(rows int) time.Duration, a float64) bool {
	if k < 1 {
		return false
	}
	c1, ck := stepCost(1), stepCost(k+1)
	return c1 > 0 && ck > 0 && Expected(k, a)*float64(c1) > float64(ck)
}

// Best returns the k in [0, kMax] with the most expected tokens per unit
// time, 0 (plain decoding) unless some k beats it; the smallest on ties.
func Best(kMax int, stepCost func(rows int) time.Duration, a float64) int {
	best, bestTok, bestCost := 0, 1.0, stepCost(1)
	if bestCost <= 0 {
		return 0
	}
	for k := 1; k <= kMax; k++ {
		c := stepCost(k + 1)
		if c <= 0 {
			continue
		}
		if e := Expected(k, a); e*float64(bestCost) > bestTok*float64(c) {
			best, bestTok, bestCost = k, e, c
		}
	}
	return best
}
