package tokenizer

import "unicode/utf8"

// Kimi's Python wrapper cuts the text before tiktoken sees it: into chunks of
// at most 400,000 characters, and each chunk wherever a run of same-class
// characters (Python's str.isspace or not) grows past 25,000. Each cut piece
// is then encoded on its own, so a cut also ends the pattern's lookahead.
const (
	maxEncodeChars = 400_000
	maxRunChars    = 25_000
)

// cutter yields the wrapper's pieces of a text. Its limits are fields so
// that tests can exercise the cuts with small texts.
type cutter struct {
	chunkChars int // characters per chunk
	runChars   int // longest run of same-class characters
}

var kimiCuts = cutter{chunkChars: maxEncodeChars, runChars: maxRunChars}

// cut calls yield with each piece of s (valid UTF-8) in order.
func (c cutter) cut(s string, yield func(piece string)) {
	for len(s) > 0 {
		// Find the end of this chunk: chunkChars characters.
		end, n := 0, 0
		for end < len(s) && n < c.chunkChars {
			if s[end] < utf8.RuneSelf {
				end++
			} else {
				_, size := utf8.DecodeRuneInString(s[end:])
				end += size
			}
			n++
		}
		c.cutRuns(s[:end], yield)
		s = s[end:]
	}
}

// cutRuns is the wrapper's _split_whitespaces_or_nonwhitespaces.
func (c cutter) cutRuns(s string, yield func(piece string)) {
	start, runLen := 0, 0
	inSpace := false
	for i := 0; i < len(s); {
		r, size := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		space := pySpace(r)
		if i == 0 || space != inSpace {
			inSpace, runLen = space, 1
		} else {
			runLen++
			if runLen > c.runChars {
				yield(s[start:i])
				start, runLen = i, 1
			}
		}
		i += size
	}
	yield(s[start:])
}
