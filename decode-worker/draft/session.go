package draft

import "fmt"

// SessionConfig sizes a SessionIndex.
type SessionConfig struct {
	MinN, MaxN int // suffix lengths matched, 1 <= MinN <= MaxN
	// MaxTokens caps the tokens held over all chains (about 30 bytes
	// each with the index); past it the oldest chains are evicted, and a
	// longer chain keeps its last MaxTokens tokens.
	MaxTokens int
	// PerKey caps the occurrences kept per MinN-gram (the newest), which
	// bounds a lookup's work at PerKey * MaxN comparisons.
	PerKey int
}

// SessionIndex drafts from earlier turns: token chains (such as the prefix
// cache's) indexed by their MinN-grams, so that a later turn drafts the
// continuation of the longest match across them, under the agreement rule.
// It is not safe for concurrent use.
type SessionIndex struct {
	cfg    SessionConfig
	chains map[uint64]*chain
	order  []*chain // by insertion, oldest first; removed ones linger
	index  map[uint64][]loc
	tokens int
}

type chain struct {
	id   uint64
	toks []int32
	gone bool
}

// loc is an occurrence: the MinN-gram c.toks[end-MinN:end].
type loc struct {
	c   *chain
	end int32
}

// NewSessionIndex returns an empty index, or an error naming the setting
// out of range.
func NewSessionIndex(cfg SessionConfig) (*SessionIndex, error) {
	if cfg.MinN < 1 || cfg.MaxN < cfg.MinN || cfg.MaxTokens < 1 || cfg.PerKey < 1 {
		return nil, fmt.Errorf("draft: session index needs 1 <= MinN <= MaxN, MaxTokens >= 1 and PerKey >= 1, got %+v", cfg)
	}
	return &SessionIndex{cfg: cfg, chains: map[uint64]*chain{}, index: map[uint64][]loc{}}, nil
}

// Tokens returns the tokens held; Len the chains.
func (s *SessionIndex) Tokens() int { return s.tokens }

// Len returns the number of chains held.
func (s *SessionIndex) Len() int { return len(s.chains) }

func hash(toks []int32) uint64 {
	h := uint64(14695981039346656037)
	for _, t := range toks {
		h ^= uint64(uint32(t))
		h *= 1099511628211
	}
	return h
}

// Add indexes a copy of toks under id, replacing what id held, and evicts
// the oldest chains while over MaxTokens.
func (s *SessionIndex) Add(id uint64, toks []int32) {
	s.Remove(id)
	if len(toks) > s.cfg.MaxTokens {
		toks = toks[len(toks)-s.cfg.MaxTokens:]
	}
	c := &chain{id: id, toks: append([]int32(nil), toks...)}
	s.chains[id] = c
	s.order = append(s.order, c)
	s.tokens += len(c.toks)
	n := s.cfg.MinN
	for e := n; e < len(c.toks); e++ {
		key := hash(c.toks[e-n : e])
		l := append(s.index[key], loc{c, int32(e)})
		if len(l) > s.cfg.PerKey {
			l = append(l[:0], l[1:]...)
		}
		s.index[key] = l
	}
	for s.tokens > s.cfg.MaxTokens {
		old := s.order[0]
		s.order = s.order[1:]
		if !old.gone {
			s.drop(old)
		}
	}
	if len(s.order) > 2*len(s.chains)+16 {
		live := s.order[:0]
		for _, c := range s.order {
			if !c.gone {
				live = append(live, c)
			}
		}
		clear(s.order[len(live):])
		s.order = live
	}
}

// Remove forgets id's chain; it reports whether there was one.
func (s *SessionIndex) Remove(id uint64) bool {
	c, ok := s.chains[id]
	if ok {
		s.drop(c)
	}
	return ok
}

func (s *SessionIndex) drop(c *chain) {
	c.gone = true
	delete(s.chains, c.id)
	s.tokens -= len(c.toks)
	n := s.cfg.MinN
	for e := n; e < len(c.toks); e++ {
		key := hash(c.toks[e-n : e])
		l, ok := s.index[key]
		if !ok {
			continue
		}
		kept := l[:0]
		for _, o := range l {
			if o.c != c {
				kept = append(kept, o)
			}
		}
		clear(l[len(kept):])
		if len(kept) == 0 {
			delete(s.index, key)
		} else {
			s.index[key] = kept
		}
	}
}

// Draft implements Drafter over the chains held.
func (s *SessionIndex) Draft(tokens []int32, k int) []int32 {
	m, n := len(tokens), s.cfg.MinN
	if k <= 0 || m < n {
		return nil
	}
	best := 0
	var ag agreement
	for _, o := range s.index[hash(tokens[m-n:])] {
		c, e := o.c.toks, int(o.end)
		l := 0
		for l < s.cfg.MaxN && l < e && l < m && c[e-1-l] == tokens[m-1-l] {
			l++
		}
		if l < n || l < best { // a hash collision, or a shorter match
			continue
		}
		if l > best {
			best = l
			ag.reset(k)
		}
		ag.add(c[e:min(e+k, len(c))])
	}
	return ag.result()
}
