package planner

// Range is the batch rows [Lo, Hi) of one layer call.
type Range struct{ Lo, Hi int }

// Tiles cuts the rows of pieces of the given lengths, laid out back to back,
// into calls of at most tile rows. A call may span several pieces; a piece
// is cut only at multiples of Align from its start (which is itself a
// multiple of Align from its prompt's start), so each sequence's chunked
// KDA sees the chunks of one call over its whole prompt.
func Tiles(lens []int, tile int) []Range {
	tile = max(Align, tile-tile%Align)
	var out []Range
	start, off := 0, 0
	for _, n := range lens {
		for pos := 0; pos < n; {
			room := start + tile - (off + pos)
			if n-pos <= room {
				pos = n
				break
			}
			cut := room - room%Align
			if cut == 0 {
				// The tile is partly used and the piece cannot be cut to fit:
				// close it and start the next one here.
				out = append(out, Range{start, off + pos})
				start = off + pos
				continue
			}
			pos += cut
			out = append(out, Range{start, off + pos})
			start = off + pos
		}
		off += n
	}
	if off > start {
		out = append(out, Range{start, off})
	}
	return out
}

// NextTile is the next call of a layer whose cost per row depends on the
// row's position (attention over the cache grows with it): from batch row
// from of pieces of the given lengths laid out back to back, piece i
// starting at prompt position starts[i] (a multiple of Align), a call of at
// most tile rows (0: any) whose cost, summed over Align-row steps by
// cost(piece, lo, hi) for prompt positions [lo, hi), stays within budget.
// A call always takes at least one step. from must be the end of an
// earlier call (0 at first). Cut between calls, a layer computes exactly
// what one call over the whole batch does (see Tiles); small calls let a
// cancelled job leave within a layer.
func NextTile(lens, starts []int, from, tile int, budget float64, cost func(piece, lo, hi int) float64) Range {
	if tile > 0 {
		tile = max(Align, tile-tile%Align)
	}
	off := 0
	acc, rows := 0.0, 0
	for i, n := range lens {
		if from >= off+n {
			off += n
			continue
		}
		for pos := max(from-off, 0); pos < n; {
			next := min(n, pos+Align-pos%Align)
			c := cost(i, starts[i]+pos, starts[i]+next)
			if rows > 0 && ((tile > 0 && rows+next-pos > tile) || acc+c > budget) {
				return Range{from, off + pos}
			}
			acc += c
			rows += next - pos
			pos = next
		}
		off += n
	}
	return Range{from, off}
}
