package tokenizer

import (
	"sort"
	"sync"
	"unicode"
)

// class is a bit set of the character properties the pre-split pattern
// tests. The pattern's classes are combinations of these bits.
type class uint8

const (
	clsHan    class = 1 << iota // \p{Han} (Script=Han)
	clsUpper                    // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
	clsLower                    // [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
	clsLetter                   // \p{L}
	clsNumber                   // \p{N}
	clsSpace                    // \s (Unicode White_Space)
	clsCRLF                     // \r or \n
)

// prefixOK reports whether c is in [^\r\n\p{L}\p{N}], the optional single
// character that may open a word.
func (c class) prefixOK() bool { return c&(clsCRLF|clsLetter|clsNumber) == 0 }

// punct reports whether c is in [^\s\p{L}\p{N}].
func (c class) punct() bool { return c&(clsSpace|clsLetter|clsNumber) == 0 }

// bmpClasses holds the class of every code point below U+10000. It is built
// on first use from the range tables rather than in init, so importing the
// package costs nothing.
var (
	bmpOnce    sync.Once
	bmpClasses *[0x10000]class
)

func buildBMP() {
	t := new([0x10000]class)
	set := func(tab *unicode.RangeTable, bits class) {
		for _, r := range tab.R16 {
			for c := uint32(r.Lo); c <= uint32(r.Hi); c += uint32(r.Stride) {
				t[c] |= bits
			}
		}
	}
	set(unicode.Lu, clsUpper|clsLetter)
	set(unicode.Lt, clsUpper|clsLetter)
	set(unicode.Ll, clsLower|clsLetter)
	set(unicode.Lm, clsUpper|clsLower|clsLetter)
	set(unicode.Lo, clsUpper|clsLower|clsLetter)
	set(unicode.M, clsUpper|clsLower)
	set(unicode.N, clsNumber)
	set(unicode.White_Space, clsSpace)
	// Han is excluded from the two letter classes by the pattern's
	// intersections, so it clears those bits after they are set.
	for _, r := range unicode.Han.R16 {
		for c := uint32(r.Lo); c <= uint32(r.Hi); c += uint32(r.Stride) {
			t[c] = t[c]&^(clsUpper|clsLower) | clsHan
		}
	}
	t['\r'] |= clsCRLF
	t['\n'] |= clsCRLF
	for _, u := range unicodeUpdates {
		for r := u.lo; r <= u.hi && r < 0x10000; r++ {
			t[r] = u.c
		}
	}
	bmpClasses = t
}

// classRange gives the characters lo..hi the class c.
type classRange struct {
	lo, hi rune
	c      class
}

// updatedClass looks r up in unicodeUpdates (unicode_update.go): the
// characters whose class in the reference's newer Unicode tables differs
// from Go's.
func updatedClass(r rune) (class, bool) {
	i := sort.Search(len(unicodeUpdates), func(i int) bool { return unicodeUpdates[i].hi >= r })
	if i < len(unicodeUpdates) && unicodeUpdates[i].lo <= r {
		return unicodeUpdates[i].c, true
	}
	return 0, false
}

// asciiClasses is the class of every ASCII byte, the common case.
var asciiClasses = func() (t [128]class) {
	for c := rune(0); c < 128; c++ {
		t[c] = slowClassOf(c) // no updates: ASCII is stable
	}
	return t
}()

// classOf returns the pattern classes of r.
func classOf(r rune) class {
	if r < 128 {
		return asciiClasses[r]
	}
	if r < 0x10000 {
		bmpOnce.Do(buildBMP)
		return bmpClasses[r]
	}
	if c, ok := updatedClass(r); ok {
		return c
	}
	return slowClassOf(r)
}

// slowClassOf computes the class of r from Go's unicode tables alone.
func slowClassOf(r rune) class {
	var c class
	switch {
	case unicode.In(r, unicode.Lu, unicode.Lt):
		c = clsUpper | clsLetter
	case unicode.Is(unicode.Ll, r):
		c = clsLower | clsLetter
	case unicode.In(r, unicode.Lm, unicode.Lo):
		c = clsUpper | clsLower | clsLetter
	case unicode.Is(unicode.M, r):
		c = clsUpper | clsLower
	case unicode.Is(unicode.N, r):
		c = clsNumber
	}
	if unicode.Is(unicode.White_Space, r) {
		c |= clsSpace
	}
	if unicode.Is(unicode.Han, r) {
		c = c&^(clsUpper|clsLower) | clsHan
	}
	if r == '\r' || r == '\n' {
		c |= clsCRLF
	}
	return c
}

// pySpace reports whether Python's str.isspace is true for r: general
// category Zs or bidirectional class WS, B or S. It differs from White_Space
// by U+001C..U+001F. Kimi's wrapper uses it to cut long runs.
func pySpace(r rune) bool {
	switch {
	case r <= 0x20:
		return r == ' ' || (r >= '\t' && r <= '\r') || (r >= 0x1c && r <= 0x1f)
	case r < 0x85:
		return false
	}
	switch r {
	case 0x85, 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}
