package sampling

import "fmt"

// Verify checks a deterministic draft against the rows the model computed
// for it and returns how many drafted tokens are accepted and the token
// that follows them. rows[i] holds the logits for the position draft[i]
// would fill, and rows[len(draft)] those for the position after the whole
// draft (the bonus row), so len(rows) must be len(draft)+1. mask, when not
// nil, gives row i's grammar mask (as in SampleMasked) given that draft[:i]
// was accepted; it is called only for the rows Verify reaches, in order, and
// may return nil for an unconstrained row.
//
// The rule is exact: the tokens emitted, draft[:accepted] then next, are
// distributed as plain decoding's. Verify draws row i's token y from the
// sampler's own distribution p (temperature, top-k, top-p, mask; the argmax
// when greedy) with the sampler's seeded stream, exactly as Sample does, and
// accepts draft[i] if y equals it; at the first mismatch y is the next
// token. For a deterministic draft this is the standard speculative rule:
// draft[i] is accepted with probability p(draft[i]), and on rejection y is
// distributed as p with draft[i] removed and renormalised. It consumes one
// draw per emitted token, as Sample does, so with the same seed and the same
// logits a run with drafts emits the very tokens a run without them does.
//
// A drafted id the mask forbids, or outside the vocabulary, is never
// accepted. Stop sequences, max_tokens and cancellation stay the caller's:
// it drafts at most the remaining budget less one and checks the emitted
// tokens in order, as it would tokens sampled one at a time. An error (bad
// logits, an empty mask) reports the tokens accepted before the failing row.
func (s *Sampler) Verify(rows [][]float32, draft []int32, mask func(i int) []uint64) (accepted int, next int32, err error) {
	if len(rows) != len(draft)+1 {
		return 0, 0, fmt.Errorf("sampling: verify needs %d rows for a draft of %d, got %d", len(draft)+1, len(draft), len(rows))
	}
	for i, row := range rows {
		var m []uint64
		if mask != nil {
			m = mask(i)
		}
		y, err := s.sample(row, m)
		if err != nil {
			return i, 0, fmt.Errorf("row %d: %w", i, err)
		}
		if i == len(draft) || y != draft[i] {
			return i, y, nil
		}
	}
	panic("unreachable")
}
