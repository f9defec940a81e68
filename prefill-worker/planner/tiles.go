package planner

import "github.com/tandem-inference/tandem/model"

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
// row's position (attention over the cache grows with it): model.NextCall
// as a Range, for the executor's and the planner's callers. Cut between
// calls, a layer computes exactly what one call over the whole batch does
// (see Tiles); small calls let a cancelled job leave within a layer.
func NextTile(lens, starts []int, from, tile int, budget float64, cost func(piece, lo, hi int) float64) Range {
	lo, hi := model.NextCall(lens, starts, from, tile, budget, cost)
	return Range{lo, hi}
}
