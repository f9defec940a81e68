// Package sampling picks the next token from a sequence's logits: greedy,
// or seeded random sampling with temperature, top-k and top-p (nucleus).
//
// A Sampler is deterministic: the same parameters, seed and logits give the
// same tokens on every rank count and batch composition, because logits do
// not depend on the batch and every sum runs in a fixed order in float64;
// and on amd64 and arm64 alike, because the weights come from
// internal/expmath's exp, not math.Exp (whose last bits differ between the
// two), and no product here feeds a sum the compiler could fuse.
package sampling

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"

	"github.com/tandem-inference/tandem/internal/expmath"
)

// Limits of the parameters (the control plane's are the same or tighter).
const MaxTemperature = 100

// Params choose how tokens are drawn. The zero value is greedy.
type Params struct {
	// Temperature divides the logits; 0 means greedy (argmax, first on ties,
	// like model.Argmax), whatever TopK and TopP say.
	Temperature float64
	// TopK keeps the K most likely tokens; 0 means no limit.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches TopP; 0 or 1 means no limit.
	TopP float64
	// Seed seeds the draws: same seed, same logits, same tokens.
	Seed uint64
}

// Greedy reports whether the parameters pick the argmax.
func (p Params) Greedy() bool { return p.Temperature == 0 }

// Validate names the first parameter out of range.
func (p Params) Validate() error {
	switch {
	case math.IsNaN(p.Temperature) || p.Temperature < 0 || p.Temperature > MaxTemperature:
		return fmt.Errorf("sampling: temperature %v outside [0, %d]", p.Temperature, MaxTemperature)
	case p.TopK < 0:
		return fmt.Errorf("sampling: top_k %d is negative", p.TopK)
	case math.IsNaN(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return fmt.Errorf("sampling: top_p %v outside [0, 1]", p.TopP)
	}
	return nil
}

// Sampler draws one sequence's tokens. It is not safe for concurrent use.
type Sampler struct {
	p   Params
	rng *rand.Rand

	// scratch, reused across calls
	cand []int32
	w    []float64
}

// New returns a sampler for p, seeded with p.Seed.
func New(p Params) (*Sampler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	// The second PCG word is a fixed stream constant, so that the seed alone
	// decides the draws.
	return &Sampler{p: p, rng: rand.New(rand.NewPCG(p.Seed, 0x746f6b656e73))}, nil
}

// Params returns the sampler's parameters.
func (s *Sampler) Params() Params { return s.p }

// Argmax returns the index of the largest logit, the first on ties; NaNs
// are never chosen over a number (model.Argmax's rule).
func Argmax(logits []float32) int {
	best := 0
	for i, x := range logits {
		if x > logits[best] {
			best = i
		}
	}
	return best
}

// Sample returns the next token. Greedy sampling never fails; random
// sampling refuses logits that are not all finite, since they would make the
// distribution meaningless.
func (s *Sampler) Sample(logits []float32) (int32, error) {
	return s.sample(logits, nil)
}

// SampleMasked returns the next token among the ids whose bit is set in
// mask (bit id%64 of word id/64; a grammar's mask): the others are out
// before temperature, top-k and top-p. Greedy takes the argmax among the
// allowed ids. It fails if no id is allowed; the draws stay seeded, as in
// Sample.
func (s *Sampler) SampleMasked(logits []float32, mask []uint64) (int32, error) {
	if mask == nil {
		return 0, fmt.Errorf("sampling: no mask")
	}
	return s.sample(logits, mask)
}

// each calls f for every id below n that mask allows (all of them for a
// nil mask), in increasing order, skipping masked-off words whole.
func each(mask []uint64, n int, f func(id int)) {
	if mask == nil {
		for i := range n {
			f(i)
		}
		return
	}
	for w, word := range mask {
		for word != 0 {
			id := w*64 + bits.TrailingZeros64(word)
			if id >= n {
				return
			}
			f(id)
			word &= word - 1
		}
	}
}

func (s *Sampler) sample(logits []float32, mask []uint64) (int32, error) {
	if len(logits) == 0 {
		return 0, fmt.Errorf("sampling: no logits")
	}
	if s.p.Greedy() {
		if mask == nil {
			return int32(Argmax(logits)), nil
		}
		best := -1
		each(mask, len(logits), func(i int) {
			if best < 0 || logits[i] > logits[best] {
				best = i
			}
		})
		if best < 0 {
			return 0, fmt.Errorf("sampling: the mask allows no token")
		}
		return int32(best), nil
	}
	cand, total, err := s.dist(logits, mask)
	if err != nil {
		return 0, err
	}
	u := s.rng.Float64() * total
	acc := 0.0
	for j, i := range cand {
		acc += s.w[j]
		if u < acc {
			return i, nil
		}
	}
	return cand[len(cand)-1], nil // u rounded up to total
}

// dist returns the random path's distribution: the candidate ids and their
// total weight, with their weights in s.w (valid until the next call).
func (s *Sampler) dist(logits []float32, mask []uint64) ([]int32, float64, error) {
	bad := -1
	if mask == nil {
		for i, x := range logits {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				bad = i
				break
			}
		}
	} else {
		each(mask, len(logits), func(i int) {
			if x := float64(logits[i]); bad < 0 && (math.IsNaN(x) || math.IsInf(x, 0)) {
				bad = i
			}
		})
	}
	if bad >= 0 {
		return nil, 0, fmt.Errorf("sampling: logit %d is %v", bad, logits[bad])
	}
	cand := s.candidates(logits, mask)
	if len(cand) == 0 {
		return nil, 0, fmt.Errorf("sampling: the mask allows no token")
	}
	// Softmax weights relative to the largest candidate, in float64.
	maxl := logits[cand[0]]
	for _, i := range cand {
		maxl = max(maxl, logits[i])
	}
	invT := 1 / s.p.Temperature
	s.w = s.w[:0]
	total := 0.0
	for _, i := range cand {
		w := expmath.Exp(float64(logits[i]-maxl) * invT)
		s.w = append(s.w, w)
		total += w
	}
	if s.p.TopP > 0 && s.p.TopP < 1 {
		cand, total = s.nucleus(cand, total)
	}
	return cand, total, nil
}

// candidates returns the token ids still in play (among those mask
// allows) after top-k: all of them in id order, or the K most likely in
// descending order (ties: lower id).
func (s *Sampler) candidates(logits []float32, mask []uint64) []int32 {
	s.cand = s.cand[:0]
	k := s.p.TopK
	if k == 0 || k >= len(logits) {
		if mask == nil {
			for i := range logits {
				s.cand = append(s.cand, int32(i))
			}
		} else {
			each(mask, len(logits), func(i int) { s.cand = append(s.cand, int32(i)) })
		}
		return s.cand
	}
	h := minHeap{logits: logits, ids: s.cand}
	each(mask, len(logits), func(i int) {
		id := int32(i)
		if len(h.ids) < k {
			h.push(id)
		} else if h.above(id, h.ids[0]) {
			h.ids[0] = id
			h.down(0)
		}
	})
	// Pop ascending into the tail, giving descending order.
	out := h.ids
	for n := len(out) - 1; n > 0; n-- {
		out[0], out[n] = out[n], out[0]
		h.ids = out[:n]
		h.down(0)
	}
	s.cand = out
	return out
}

// nucleus keeps the most likely candidates, in descending order, until
// their weight reaches TopP of the total (at least one). s.w holds the
// candidates' weights and is rewritten to match the result.
func (s *Sampler) nucleus(cand []int32, total float64) ([]int32, float64) {
	h := maxHeap{w: s.w, ids: cand, pos: make([]int32, len(cand))}
	for j := range h.pos {
		h.pos[j] = int32(j)
	}
	h.init()
	limit := s.p.TopP * total
	var ids []int32
	var ws []float64
	acc := 0.0
	for len(h.pos) > 0 && (acc < limit || len(ids) == 0) {
		j := h.pop()
		ids = append(ids, cand[j])
		ws = append(ws, s.w[j])
		acc += s.w[j]
	}
	s.w = append(s.w[:0], ws...)
	return ids, acc
}
