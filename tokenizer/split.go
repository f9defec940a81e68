package tokenizer

import "unicode/utf8"

// Kimi's pre-split pattern, as published with Kimi K2 and reused by K3. Go's
// regexp cannot express its class intersections or its negative lookahead,
// so splitPieces below implements the eight alternatives by hand with the
// leftmost-first, backtracking semantics of the reference engine.
const splitPattern = `[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// SplitPattern returns Kimi's pre-split pattern in Rust/Python regex syntax,
// the text the reference implementations compile.
func SplitPattern() string { return splitPattern }

// splitPieces calls yield with each pre-split piece of s in order. s must be
// valid UTF-8. The pieces concatenate to s.
func splitPieces(s string, yield func(piece string)) {
	for i := 0; i < len(s); {
		j := pieceEnd(s, i)
		yield(s[i:j])
		i = j
	}
}

// at returns the class and byte length of the character at s[i].
func at(s string, i int) (class, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return asciiClasses[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return classOf(r), n
}

// pieceEnd returns the end of the piece that starts at i < len(s): the match
// of the first alternative that matches at i.
func pieceEnd(s string, i int) int {
	c, n := at(s, i)

	// (1) [\p{Han}]+
	if c&clsHan != 0 {
		return runEnd(s, i+n, clsHan)
	}
	// (2) and (3): words, optionally opened by one non-letter character.
	if c.prefixOK() || c&(clsUpper|clsLower) != 0 {
		if e := wordEnd(s, i, c, n); e > 0 {
			return e
		}
	}
	// (4) \p{N}{1,3}
	if c&clsNumber != 0 {
		e := i + n
		for k := 1; k < 3 && e < len(s); k++ {
			c2, n2 := at(s, e)
			if c2&clsNumber == 0 {
				break
			}
			e += n2
		}
		return e
	}
	// (5) ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	start := -1
	if c.punct() {
		start = i
	} else if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := at(s, i+1); c2.punct() {
			start = i + 1
		}
	}
	if start >= 0 {
		e := punctEnd(s, start)
		for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	// (6) \s*[\r\n]+, (7) \s+(?!\S), (8) \s+
	if c&clsSpace != 0 {
		lastNL, lastStart := -1, i
		e := i
		for e < len(s) {
			c2, n2 := at(s, e)
			if c2&clsSpace == 0 {
				break
			}
			if c2&clsCRLF != 0 {
				lastNL = e
			}
			lastStart = e
			e += n2
		}
		switch {
		case lastNL >= 0:
			return lastNL + 1 // CR and LF are one byte
		case e == len(s) || lastStart == i:
			return e
		default:
			// Leave the last space to open the next piece.
			return lastStart
		}
	}
	// Unreachable: every character is Han, a letter or mark, a number,
	// punctuation or a space. Consume one character rather than loop.
	return i + n
}

// runEnd returns the end of the run of characters from i whose class
// shares a bit with want.
func runEnd(s string, i int, want class) int {
	for i < len(s) {
		c, n := at(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

// punctEnd returns the end of the run of [^\s\p{L}\p{N}] characters from i.
func punctEnd(s string, i int) int {
	for i < len(s) {
		c, n := at(s, i)
		if !c.punct() {
			break
		}
		i += n
	}
	return i
}

// wordEnd tries alternatives (2) and (3) at i, whose first character has
// class c and length n. It returns the end of the match, or -1.
//
// (2) P? U* L+ C?   (3) P? U+ L* C?
//
// P is the optional prefix, U the upper class, L the lower class and C a
// contraction. Both alternatives first try with the prefix taken, then
// without; U* backtracks until L+ can start.
func wordEnd(s string, i int, c class, n int) int {
	var starts [2]int
	k := 0
	if c.prefixOK() {
		starts[k] = i + n
		k++
	}
	if c&(clsUpper|clsLower) != 0 {
		starts[k] = i
		k++
	}
	// (2)
	for _, s0 := range starts[:k] {
		// Scan U*, remembering the last position whose character is in
		// both U and L: where U* gives back to let L+ start.
		lastBoth := -1
		e := s0
		var cAfter class
		for e < len(s) {
			c2, n2 := at(s, e)
			if c2&clsUpper == 0 {
				cAfter = c2
				break
			}
			if c2&clsLower != 0 {
				lastBoth = e
			}
			e += n2
		}
		q := -1
		if e < len(s) && cAfter&clsLower != 0 {
			q = e
		} else if lastBoth >= 0 {
			q = lastBoth
		}
		if q >= 0 {
			return contractionEnd(s, runEnd(s, q, clsLower))
		}
	}
	// (3)
	for _, s0 := range starts[:k] {
		e := runEnd(s, s0, clsUpper)
		if e > s0 {
			return contractionEnd(s, runEnd(s, e, clsLower))
		}
	}
	return -1
}

// contractionEnd matches (?i:'s|'t|'re|'ve|'m|'ll|'d)? at i. Case folding
// is Unicode's simple folding, so 's also matches U+017F (long s).
func contractionEnd(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return i
	}
	lower := func(b byte) byte { return b | 0x20 }
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return i + 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return i + 3
		}
	}
	if s[i+1] == 0xc5 && i+2 < len(s) && s[i+2] == 0xbf { // ſ U+017F
		return i + 3
	}
	return i
}
