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
