package tokenizer

import "math"

const (
	noRank = math.MaxInt // a pair that is not a token

	// Pieces up to shortPiece bytes are merged by scanning for the lowest
	// rank, as tiktoken does (quadratic, but cache-friendly for short
	// words); longer ones use a heap, so a 25,000-character run stays
	// linear-logarithmic.
	shortPiece = 128

	// The per-call cache of merged pieces is dropped when it grows past
	// cacheEntries, which bounds an encode's memory for text with few
	// repeats. Pieces longer than cachePiece bytes are not cached.
	cacheEntries = 1 << 16
	cachePiece   = 64
)

// encoder holds one Encode call's output and scratch space. It is not shared
// between calls, so the tokenizer needs no locks.
type encoder struct {
	t     *Tokenizer
	out   []int
	cache map[string]span // piece -> its ids in arena
	arena []int
	parts []part
	heap  pairHeap
}

type span struct{ off, n int32 }

// part is a merge candidate: the part starting at start and the rank of it
// merged with the next part.
type part struct{ start, rank int }

func newEncoder(t *Tokenizer) *encoder {
	return &encoder{t: t, cache: make(map[string]span)}
}

// ordinary encodes s, which contains no special tokens, after the cuts.
func (e *encoder) ordinary(s string) {
	splitPieces(s, e.piece)
}

// piece appends the ids of one pre-split piece.
func (e *encoder) piece(p string) {
	// Repeated pieces are answered from the small per-call cache, which
	// stays in the CPU caches where the rank map does not.
	cacheable := len(p) <= cachePiece
	if cacheable {
		if sp, ok := e.cache[p]; ok {
			e.out = append(e.out, e.arena[sp.off:sp.off+sp.n]...)
			return
		}
	}
	start := len(e.out)
	// A piece that is a token is that token, even when merging would not
	// reach it: tiktoken looks the whole piece up first.
	if r, ok := e.t.v.rank[p]; ok {
		e.out = append(e.out, r)
	} else if len(p) <= shortPiece {
		e.out = e.mergeShort(e.out, p)
	} else {
		e.out = e.mergeLong(e.out, p)
	}
	if cacheable {
		if len(e.cache) >= cacheEntries {
			clear(e.cache)
			e.arena = e.arena[:0]
		}
		e.cache[p] = span{int32(len(e.arena)), int32(len(e.out) - start)}
		e.arena = append(e.arena, e.out[start:]...)
	}
}

func (e *encoder) rank(b string) int {
	if r, ok := e.t.v.rank[b]; ok {
		return r
	}
	return noRank
}

// mergeShort is tiktoken's merge loop: repeatedly merge the adjacent pair
// whose concatenation has the lowest rank, the leftmost on ties.
func (e *encoder) mergeShort(out []int, p string) []int {
	parts := e.parts[:0]
	for i := 0; i < len(p)-1; i++ {
		parts = append(parts, part{i, e.rank(p[i : i+2])})
	}
	parts = append(parts, part{len(p) - 1, noRank}, part{len(p), noRank})
	// pairRank is the rank of parts i and i+1 merged with part i+2, read
	// before part i+1 is removed.
	pairRank := func(i int) int {
		if i+3 < len(parts) {
			return e.rank(p[parts[i].start:parts[i+3].start])
		}
		return noRank
	}
	for {
		best, bi := noRank, -1
		for i := 0; i < len(parts)-1; i++ {
			if parts[i].rank < best {
				best, bi = parts[i].rank, i
			}
		}
		if bi < 0 {
			break
		}
		if bi > 0 {
			parts[bi-1].rank = pairRank(bi - 1)
		}
		parts[bi].rank = pairRank(bi)
		parts = append(parts[:bi+1], parts[bi+2:]...)
	}
	for i := 0; i < len(parts)-1; i++ {
		out = append(out, e.t.v.rank[p[parts[i].start:parts[i+1].start]])
	}
	e.parts = parts
	return out
}

// mergeLong performs the same merges as mergeShort with a linked list of
// parts and a heap of candidate pairs ordered by (rank, start), so the
// leftmost lowest pair is always merged first. Stale heap entries are
// recognised by their end no longer matching the pair's current end.
func (e *encoder) mergeLong(out []int, p string) []int {
	n := len(p)
	// Parts are named by their start offset; next[i] is the start of the
	// part after part i (n at the end), dead[i] marks merged-away parts.
	next := make([]int32, n)
	prev := make([]int32, n)
	dead := make([]bool, n)
	for i := range n {
		next[i], prev[i] = int32(i+1), int32(i-1)
	}
	end := func(i int) int { // end of the pair that starts at part i
		j := int(next[i])
		if j >= n {
			return -1
		}
		return int(next[j])
	}
	h := e.heap[:0]
	push := func(i int) {
		if x := end(i); x >= 0 {
			if r := e.rank(p[i:x]); r != noRank {
				h.push(pairEntry{rank: r, start: int32(i), end: int32(x)})
			}
		}
	}
	for i := 0; i < n-1; i++ {
		push(i)
	}
	for len(h) > 0 {
		top := h.pop()
		i := int(top.start)
		if dead[i] || end(i) != int(top.end) {
			continue // stale
		}
		j := int(next[i])
		dead[j] = true
		next[i] = next[j]
		if int(next[j]) < n {
			prev[next[j]] = int32(i)
		}
		if pi := int(prev[i]); pi >= 0 {
			push(pi)
		}
		push(i)
	}
	e.heap = h
	for i := 0; i < n; i = int(next[i]) {
		out = append(out, e.t.v.rank[p[i:next[i]]])
	}
	return out
}

type pairEntry struct {
	rank       int
	start, end int32
}

func (a pairEntry) less(b pairEntry) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.start < b.start)
}

// pairHeap is a binary min-heap of merge candidates.
type pairHeap []pairEntry

func (h *pairHeap) push(x pairEntry) {
	*h = append(*h, x)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s[i].less(s[parent]) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

func (h *pairHeap) pop() pairEntry {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < len(s) && s[l].less(s[small]) {
			small = l
		}
		if r := l + 1; r < len(s) && s[r].less(s[small]) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}
