// Package pyquote writes strings as Python's json.dumps does with
// ensure_ascii=False, the form K3's released renderer uses: only the quote,
// the backslash and control characters escaped, everything else as is.
package pyquote

import "strings"

// Write appends s to b as a JSON string in json.dumps's form.
func Write(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&15])
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}

// Quote is s as a JSON string in json.dumps's form.
func Quote(s string) string {
	var b strings.Builder
	Write(&b, s)
	return b.String()
}
