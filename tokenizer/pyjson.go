package tokenizer

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tandem-inference/tandem/internal/pyquote"
)

// pyValue is a JSON value as Python's json.loads returns it: objects keep
// their keys' first-seen order (a repeated key keeps its first place and its
// last value), integers keep their digits, other numbers are float64.
type pyValue struct {
	kind  pyKind
	str   string // pyString; pyInt: the digits
	num   float64
	b     bool
	items []pyValue // pyArray
	keys  []string  // pyObject
	vals  []pyValue // pyObject
}

type pyKind uint8

const (
	pyNull pyKind = iota
	pyBool
	pyInt
	pyFloat
	pyString
	pyArray
	pyObject
)

// maxJSONDepth bounds nesting: the input comes from clients.
const maxJSONDepth = 512

var errPyJSON = errors.New("invalid JSON")

// parsePyJSON parses s as Python's json.loads does (NaN, Infinity and
// -Infinity included); it fails where json.loads raises.
func parsePyJSON(s string) (pyValue, error) {
	p := pyParser{s: s}
	p.ws()
	v, err := p.value(0)
	if err != nil {
		return v, err
	}
	p.ws()
	if p.i != len(p.s) {
		return v, fmt.Errorf("%w: extra data at byte %d", errPyJSON, p.i)
	}
	return v, nil
}

type pyParser struct {
	s string
	i int
}

func (p *pyParser) fail(what string) error {
	return fmt.Errorf("%w: %s at byte %d", errPyJSON, what, p.i)
}

// ws skips JSON whitespace (the four characters json.loads skips).
func (p *pyParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *pyParser) value(depth int) (pyValue, error) {
	if depth > maxJSONDepth {
		return pyValue{}, p.fail("nesting too deep")
	}
	if p.i >= len(p.s) {
		return pyValue{}, p.fail("expecting value")
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.string()
		return pyValue{kind: pyString, str: s}, err
	case strings.HasPrefix(p.s[p.i:], "null"):
		p.i += 4
		return pyValue{kind: pyNull}, nil
	case strings.HasPrefix(p.s[p.i:], "true"):
		p.i += 4
		return pyValue{kind: pyBool, b: true}, nil
	case strings.HasPrefix(p.s[p.i:], "false"):
		p.i += 5
		return pyValue{kind: pyBool}, nil
	case strings.HasPrefix(p.s[p.i:], "NaN"):
		p.i += 3
		return pyValue{kind: pyFloat, num: math.NaN()}, nil
	case strings.HasPrefix(p.s[p.i:], "Infinity"):
		p.i += 8
		return pyValue{kind: pyFloat, num: math.Inf(1)}, nil
	case strings.HasPrefix(p.s[p.i:], "-Infinity"):
		p.i += 9
		return pyValue{kind: pyFloat, num: math.Inf(-1)}, nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	}
	return pyValue{}, p.fail("expecting value")
}

func (p *pyParser) object(depth int) (pyValue, error) {
	v := pyValue{kind: pyObject}
	index := map[string]int{}
	p.i++ // {
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return v, nil
	}
	for {
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return v, p.fail("expecting property name enclosed in double quotes")
		}
		k, err := p.string()
		if err != nil {
			return v, err
		}
		p.ws()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return v, p.fail("expecting ':' delimiter")
		}
		p.i++
		p.ws()
		val, err := p.value(depth + 1)
		if err != nil {
			return v, err
		}
		if j, ok := index[k]; ok {
			v.vals[j] = val // a dict keeps the first place, the last value
		} else {
			index[k] = len(v.keys)
			v.keys = append(v.keys, k)
			v.vals = append(v.vals, val)
		}
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			p.ws()
			continue
		}
		if p.i < len(p.s) && p.s[p.i] == '}' {
			p.i++
			return v, nil
		}
		return v, p.fail("expecting ',' delimiter")
	}
}

func (p *pyParser) array(depth int) (pyValue, error) {
	v := pyValue{kind: pyArray}
	p.i++ // [
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return v, nil
	}
	for {
		item, err := p.value(depth + 1)
		if err != nil {
			return v, err
		}
		v.items = append(v.items, item)
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == ',' {
			p.i++
			p.ws()
			continue
		}
		if p.i < len(p.s) && p.s[p.i] == ']' {
			p.i++
			return v, nil
		}
		return v, p.fail("expecting ',' delimiter")
	}
}

// number reads JSON's number grammar; an integer literal stays digits (as
// Python's int), any other becomes a float64.
func (p *pyParser) number() (pyValue, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	switch {
	case p.i < len(p.s) && p.s[p.i] == '0':
		p.i++
	case digits() == 0:
		return pyValue{}, p.fail("expecting value")
	}
	isFloat := false
	if p.i+1 < len(p.s) && p.s[p.i] == '.' && p.s[p.i+1] >= '0' && p.s[p.i+1] <= '9' {
		p.i++
		digits()
		isFloat = true
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		save := p.i
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			p.i = save // json.loads leaves a bare exponent marker unread
		} else {
			isFloat = true
		}
	}
	lit := p.s[start:p.i]
	if !isFloat {
		lit = strings.TrimPrefix(lit, "-")
		if lit == "0" {
			return pyValue{kind: pyInt, str: "0"}, nil
		}
		if p.s[start] == '-' {
			lit = "-" + lit
		}
		return pyValue{kind: pyInt, str: lit}, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return pyValue{}, p.fail("bad number")
	}
	return pyValue{kind: pyFloat, num: f}, nil // out of range: ±Inf or 0, as float()
}

func (p *pyParser) string() (string, error) {
	p.i++ // opening quote
	var b strings.Builder
	for {
		if p.i >= len(p.s) {
			return "", p.fail("unterminated string")
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String(), nil
		case c < 0x20:
			return "", p.fail("invalid control character")
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return "", p.fail("unterminated string")
			}
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return "", p.fail("invalid \\uXXXX escape")
				}
				if utf16.IsSurrogate(r) && strings.HasPrefix(p.s[p.i:], `\u`) {
					save := p.i
					p.i += 2
					if r2, ok := p.hex4(); ok && utf16.DecodeRune(r, r2) != utf8.RuneError {
						r = utf16.DecodeRune(r, r2)
					} else {
						p.i = save
					}
				}
				if utf16.IsSurrogate(r) {
					r = utf8.RuneError // a lone surrogate cannot be UTF-8
				}
				b.WriteRune(r)
			default:
				return "", p.fail("invalid \\escape")
			}
		default:
			j := p.i
			for j < len(p.s) && p.s[j] != '"' && p.s[j] != '\\' && p.s[j] >= 0x20 {
				j++
			}
			b.WriteString(p.s[p.i:j])
			p.i = j
		}
	}
}

func (p *pyParser) hex4() (rune, bool) {
	if p.i+4 > len(p.s) {
		return 0, false
	}
	n, err := strconv.ParseUint(p.s[p.i:p.i+4], 16, 32)
	if err != nil {
		return 0, false
	}
	p.i += 4
	return rune(n), true
}

// sorted returns v with every object's keys sorted, recursively (the
// released renderer's deep_sort_dict).
func (v pyValue) sorted() pyValue {
	switch v.kind {
	case pyArray:
		items := make([]pyValue, len(v.items))
		for i, it := range v.items {
			items[i] = it.sorted()
		}
		v.items = items
	case pyObject:
		order := make([]int, len(v.keys))
		for i := range order {
			order[i] = i
		}
		// Python orders str by code point, which is UTF-8 byte order.
		sort.Slice(order, func(a, b int) bool { return v.keys[order[a]] < v.keys[order[b]] })
		keys := make([]string, len(order))
		vals := make([]pyValue, len(order))
		for i, j := range order {
			keys[i], vals[i] = v.keys[j], v.vals[j].sorted()
		}
		v.keys, v.vals = keys, vals
	}
	return v
}

// truthy is Python's bool(v).
func (v pyValue) truthy() bool {
	switch v.kind {
	case pyNull:
		return false
	case pyBool:
		return v.b
	case pyInt:
		return v.str != "0"
	case pyFloat:
		return v.num != 0
	case pyString:
		return v.str != ""
	case pyArray:
		return len(v.items) > 0
	}
	return len(v.keys) > 0
}

// get returns an object's value for key.
func (v pyValue) get(key string) (pyValue, bool) {
	for i, k := range v.keys {
		if k == key {
			return v.vals[i], true
		}
	}
	return pyValue{}, false
}

// dumpStyle is json.dumps' separators.
type dumpStyle struct{ item, key string }

var (
	dumpCompact = dumpStyle{",", ":"}   // separators=(",", ":")
	dumpDefault = dumpStyle{", ", ": "} // json.dumps' default
)

// dump writes v as json.dumps(v, ensure_ascii=False, separators=...) does.
func (v pyValue) dump(style dumpStyle) string {
	var b strings.Builder
	v.write(&b, style)
	return b.String()
}

func (v pyValue) write(b *strings.Builder, style dumpStyle) {
	switch v.kind {
	case pyNull:
		b.WriteString("null")
	case pyBool:
		if v.b {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case pyInt:
		b.WriteString(v.str)
	case pyFloat:
		b.WriteString(pyFloatRepr(v.num))
	case pyString:
		pyquote.Write(b, v.str)
	case pyArray:
		b.WriteByte('[')
		for i, it := range v.items {
			if i > 0 {
				b.WriteString(style.item)
			}
			it.write(b, style)
		}
		b.WriteByte(']')
	case pyObject:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(style.item)
			}
			pyquote.Write(b, k)
			b.WriteString(style.key)
			v.vals[i].write(b, style)
		}
		b.WriteByte('}')
	}
}

// pyFloatRepr is Python's repr of a float as json.dumps writes it: the
// shortest digits that round-trip, in positional notation for exponents
// -4..15 and scientific otherwise, NaN and Infinity by name.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // -d.ddde±XX
	sign := ""
	if e[0] == '-' {
		sign, e = "-", e[1:]
	}
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}
