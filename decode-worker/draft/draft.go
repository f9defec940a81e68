// Package draft proposes tokens for speculative decoding and decides how
// many to propose. Everything here is pure: no I/O, no clock, no global
// randomness; the same inputs give the same drafts and decisions.
//
// A Drafter guesses the next tokens of a sequence from its tokens so far
// (prompt then output). A guess costs the model a verification row per
// token, and sampling.Sampler.Verify keeps the output exactly as without
// drafts, so a Drafter is free to be wrong: only its hit rate matters. A
// draft must be a deterministic function of its inputs (a model drafter
// drafts greedily): Verify's rule is exact for a draft distribution that
// puts all its mass on the drafted token.
// PromptLookup drafts from the sequence's own tokens, SessionIndex from
// earlier turns' token chains, and First tries drafters in order.
//
// Both lookups share the agreement rule. The longest suffix of the
// sequence (between MinN and MaxN tokens) that occurred before is the
// match; every earlier occurrence of it is followed by a continuation (up
// to k tokens, fewer where its source ends). The draft is the longest run
// on which the continuations agree: position d is drafted when every
// continuation that reaches d has the same token there, at least one
// reaches it, and every position before d is drafted. So occurrences that
// disagree at once give no draft, and a continuation cut short by the end
// of its source neither blocks nor votes past its end. Shorter matches
// are not tried when the longest gives no draft: their occurrences include
// the longest's, so they agree on no more.
//
// Adaptive sets a sequence's k from its recent acceptance, and Worth and
// Best decide whether drafting k tokens beats plain decoding at a measured
// step cost.
package draft

// Drafter proposes at most k tokens to follow tokens, a sequence's prompt
// and output so far; nil when it has no guess. It must not keep tokens or
// modify them, and the result must not alias them.
type Drafter interface {
	Draft(tokens []int32, k int) []int32
}

// First drafts with the first of its drafters that has a guess.
type First []Drafter

// Draft implements Drafter.
func (f First) Draft(tokens []int32, k int) []int32 {
	for _, d := range f {
		if out := d.Draft(tokens, k); len(out) > 0 {
			return out
		}
	}
	return nil
}

// agreement folds continuations into a draft under the package's rule.
// d views the longest continuation seen, cut at limit, the first position
// where two continuations disagreed.
type agreement struct {
	d     []int32
	limit int
}

func (a *agreement) reset(k int) { a.d, a.limit = nil, k }

func (a *agreement) add(c []int32) {
	n := min(len(c), len(a.d))
	for i := range n {
		if c[i] != a.d[i] {
			a.d, a.limit = a.d[:i], i
			return
		}
	}
	if len(c) > len(a.d) && len(a.d) < a.limit {
		a.d = c[:min(len(c), a.limit)]
	}
}

// result copies the draft out, nil when empty.
func (a *agreement) result() []int32 {
	if len(a.d) == 0 {
		return nil
	}
	return append([]int32(nil), a.d...)
}
