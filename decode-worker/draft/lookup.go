package draft

import "fmt"

// PromptLookup drafts from the sequence's own tokens: the continuation of
// the longest earlier occurrence of its last MinN to MaxN tokens, under the
// agreement rule. Its cost is one pass over the searched tokens, with at
// most MaxN comparisons where the last token recurs.
type PromptLookup struct {
	MinN, MaxN int // suffix lengths tried, 1 <= MinN <= MaxN
	// Window, when positive, searches only the last Window tokens.
	Window int
}

// Validate reports a setting out of range.
func (p PromptLookup) Validate() error {
	if p.MinN < 1 || p.MaxN < p.MinN || p.Window < 0 {
		return fmt.Errorf("draft: prompt lookup needs 1 <= MinN <= MaxN and Window >= 0, got MinN %d, MaxN %d, Window %d", p.MinN, p.MaxN, p.Window)
	}
	return nil
}

// Draft implements Drafter. Settings out of range draft nothing.
func (p PromptLookup) Draft(tokens []int32, k int) []int32 {
	if k <= 0 || p.Validate() != nil {
		return nil
	}
	if p.Window > 0 && len(tokens) > p.Window {
		tokens = tokens[len(tokens)-p.Window:]
	}
	m := len(tokens)
	if m <= p.MinN {
		return nil
	}
	last := tokens[m-1]
	best := 0
	var ag agreement
	// An occurrence ends at e < m, so a continuation tokens[e:] follows it.
	for e := 1; e < m; e++ {
		if tokens[e-1] != last {
			continue
		}
		l := 1
		for l < p.MaxN && l < e && tokens[e-1-l] == tokens[m-1-l] {
			l++
		}
		if l < p.MinN || l < best {
			continue
		}
		if l > best {
			best = l
			ag.reset(k)
		}
		ag.add(tokens[e:min(e+k, m)])
		if best == p.MaxN && ag.limit == 0 {
			return nil // no longer match can come, and this one disagrees
		}
	}
	return ag.result()
}
