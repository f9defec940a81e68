package tokenizer

import "unicode/utf8"

// Invalid UTF-8 is replaced by U+FFFD once per maximal subpart of an
// ill-formed sequence, as the WHATWG decoder, JavaScript's TextDecoder and
// Python's errors="replace" do (Unicode's recommended practice). Go's own
// conversions replace byte by byte instead, which would make the encoder see
// a different text than the reference implementations.

const replacement = "\uFFFD"

// toValidString returns s with each maximal ill-formed subpart replaced by
// U+FFFD. Valid input is returned as is, without copying.
func toValidString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	out, _ := appendValid(make([]byte, 0, len(s)+8), []byte(s), true)
	return string(out)
}

// ToValidUTF8 returns p as text with each maximal ill-formed UTF-8 subpart
// replaced by U+FFFD, the same replacement the encoder and the streaming
// decoder apply.
func ToValidUTF8(p []byte) string {
	if utf8.Valid(p) {
		return string(p)
	}
	out, _ := appendValid(make([]byte, 0, len(p)+8), p, true)
	return string(out)
}

// appendValid appends the valid text of src to dst. Unless final, a
// truncated sequence at the end of src is left unconsumed (it may be
// completed by later bytes); used says how many bytes of src were consumed.
func appendValid(dst, src []byte, final bool) (out []byte, used int) {
	i := 0
	for i < len(src) {
		if src[i] < utf8.RuneSelf {
			dst = append(dst, src[i])
			i++
			continue
		}
		r, size := utf8.DecodeRune(src[i:])
		if r != utf8.RuneError || size > 1 {
			dst = append(dst, src[i:i+size]...)
			i += size
			continue
		}
		n, truncated := illFormed(src[i:])
		if truncated && !final {
			break
		}
		dst = append(dst, replacement...)
		i += n
	}
	return dst, i
}

// illFormed measures the maximal subpart at the start of p, which does not
// begin a valid encoded character: the longest prefix that could still begin
// one (at least one byte). truncated reports that the subpart runs to the end
// of p, so more bytes could complete it.
func illFormed(p []byte) (n int, truncated bool) {
	b := p[0]
	var need int
	lo, hi := byte(0x80), byte(0xbf) // range of the first continuation byte
	switch {
	case b >= 0xc2 && b <= 0xdf:
		need = 1
	case b == 0xe0:
		need, lo = 2, 0xa0
	case b == 0xed:
		need, hi = 2, 0x9f
	case b >= 0xe1 && b <= 0xef:
		need = 2
	case b == 0xf0:
		need, lo = 3, 0x90
	case b == 0xf4:
		need, hi = 3, 0x8f
	case b >= 0xf1 && b <= 0xf3:
		need = 3
	default:
		return 1, false
	}
	for k := 1; k <= need; k++ {
		if k >= len(p) {
			return k, true
		}
		if p[k] < lo || p[k] > hi {
			return k, false
		}
		lo, hi = 0x80, 0xbf
	}
	// A complete, valid sequence: callers only pass ill-formed input, but
	// answer sensibly anyway.
	return need + 1, false
}
