package tokenizer

// trainRanks returns n token byte strings in rank order: the 256 single
// bytes, then merges learned from corpus by plain BPE training over Kimi's
// pre-split pieces (the most frequent adjacent pair first, while a pair
// occurs at least twice), then, if the corpus runs out of pairs first,
// concatenations of earlier tokens in a fixed order. Every token past the
// bytes is the concatenation of two earlier ones, so the list is a valid
// merge list whatever its length. The result depends only on corpus and n.
func trainRanks(corpus string, n int) [][]byte {
	tokens := make([][]byte, 0, n)
	index := make(map[string]int, n)
	add := func(b []byte) int {
		if id, ok := index[string(b)]; ok {
			return id
		}
		tokens = append(tokens, b)
		index[string(b)] = len(tokens) - 1
		return len(tokens) - 1
	}
	for b := 0; b < 256; b++ {
		add([]byte{byte(b)})
	}

	// Distinct pre-split pieces with their counts.
	type word struct {
		ids   []int
		count int
	}
	seen := map[string]int{}
	var words []word
	kimiCuts.cut(toValidString(corpus), func(chunk string) {
		splitPieces(chunk, func(p string) {
			if i, ok := seen[p]; ok {
				words[i].count++
				return
			}
			seen[p] = len(words)
			ids := make([]int, len(p))
			for k := range len(p) {
				ids[k] = int(p[k])
			}
			words = append(words, word{ids, 1})
		})
	})

	type pair struct{ a, b int }
	counts := map[pair]int{}
	for len(tokens) < n {
		clear(counts)
		for _, w := range words {
			for k := 0; k+1 < len(w.ids); k++ {
				counts[pair{w.ids[k], w.ids[k+1]}] += w.count
			}
		}
		best, bestN := pair{}, 1
		for p, c := range counts {
			if c > bestN || (c == bestN && bestN > 1 && (p.a < best.a || (p.a == best.a && p.b < best.b))) {
				best, bestN = p, c
			}
		}
		if bestN < 2 {
			break
		}
		merged := append(append([]byte{}, tokens[best.a]...), tokens[best.b]...)
		id := add(merged)
		for wi := range words {
			ids := words[wi].ids
			out := ids[:0]
			for k := 0; k < len(ids); k++ {
				if k+1 < len(ids) && ids[k] == best.a && ids[k+1] == best.b {
					out = append(out, id)
					k++
					continue
				}
				out = append(out, ids[k])
			}
			words[wi].ids = out
		}
	}

	// Fill the rest with pairs of earlier tokens, lowest ranks first.
	for c := 0; len(tokens) < n; c++ {
		for b := 0; b <= c && len(tokens) < n; b++ {
			add(append(append([]byte{}, tokens[b]...), tokens[c]...))
			if b != c && len(tokens) < n {
				add(append(append([]byte{}, tokens[c]...), tokens[b]...))
			}
		}
	}
	return tokens
}
