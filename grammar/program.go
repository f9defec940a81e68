package grammar

import (
	"fmt"
	"strconv"

	"github.com/tandem-inference/tandem/internal/pyquote"
)

// The automaton is a pushdown Thompson machine over symbols: a program of
// instructions, run as a set of configurations (an instruction and a stack
// of return addresses), determinized lazily (see Grammar).
type op uint8

const (
	opSym   op = iota // read a symbol in cls, go on to pc+1
	opJmp             // go to x
	opSplit           // go to x and to y
	opCall            // push pc+1, go to x
	opRet             // pop and go there
	opMatch           // the reply is complete
)

type class [(numSyms + 63) / 64]uint64

func (c *class) set(s int)      { c[s/64] |= 1 << (s % 64) }
func (c *class) has(s int) bool { return c[s/64]&(1<<(s%64)) != 0 }

type instr struct {
	op   op
	x, y int32
	cls  class
}

// Limits of a compiled program.
const (
	MaxProgram = 1 << 20 // instructions
	MaxCalls   = 16      // calls in one reply
	MaxDigits  = 16      // digits of an integer part, a fraction
	maxExp     = 2       // digits of an exponent: the value stays a finite float64
	maxStack   = 48      // nesting while matching
)

type ruleKey struct {
	s    *schema
	kind int
}

// Rule kinds.
const (
	ruleJSON     = iota // a JSON value
	ruleArgs            // a call's argument elements
	ruleString          // a JSON string
	ruleKeyChars        // a free argument key's characters
	ruleRaw             // raw text up to a marker
)

type builder struct {
	code    []instr
	rules   map[ruleKey]int32
	pending []pendingRule
	calls   []callSite
	err     error
}

type pendingRule struct {
	key ruleKey
	sep bool // JSON written with the renderer's ", " and ": "
}

type callSite struct {
	pc  int32
	key ruleKey
}

func (b *builder) pc() int32 { return int32(len(b.code)) }

func (b *builder) emit(in instr) int32 {
	if len(b.code) >= MaxProgram {
		if b.err == nil {
			b.err = fmt.Errorf("grammar: the schemas need more than %d instructions", MaxProgram)
		}
		return b.pc() - 1
	}
	b.code = append(b.code, in)
	return b.pc() - 1
}

func (b *builder) sym(syms ...int) {
	var in instr
	for _, s := range syms {
		in.cls.set(s)
	}
	b.emit(in)
}

func (b *builder) rangeSym(lo, hi int) {
	var in instr
	for s := lo; s <= hi; s++ {
		in.cls.set(s)
	}
	b.emit(in)
}

func (b *builder) classSym(c class) { b.emit(instr{op: opSym, cls: c}) }

// lit reads the bytes of s.
func (b *builder) lit(s string) {
	for i := 0; i < len(s); i++ {
		b.sym(int(s[i]))
	}
}

// alt emits each branch as an alternative; they join after.
func (b *builder) alt(branches ...func()) {
	var jumps []int32
	for i, f := range branches {
		if i == len(branches)-1 {
			f()
			break
		}
		split := b.emit(instr{op: opSplit, x: b.pc() + 1})
		f()
		jumps = append(jumps, b.emit(instr{op: opJmp}))
		b.patchY(split, b.pc())
	}
	for _, j := range jumps {
		b.patchX(j, b.pc())
	}
}

// opt emits f as optional.
func (b *builder) opt(f func()) {
	split := b.emit(instr{op: opSplit, x: b.pc() + 1})
	f()
	b.patchY(split, b.pc())
}

// star emits f repeated zero or more times.
func (b *builder) star(f func()) {
	top := b.emit(instr{op: opSplit, x: b.pc() + 1})
	f()
	b.emit(instr{op: opJmp, x: top})
	b.patchY(top, b.pc())
}

// upTo emits f at most n times.
func (b *builder) upTo(n int, f func()) {
	var splits []int32
	for range n {
		splits = append(splits, b.emit(instr{op: opSplit, x: b.pc() + 1}))
		f()
	}
	for _, s := range splits {
		b.patchY(s, b.pc())
	}
}

func (b *builder) patchX(at, to int32) {
	if int(at) < len(b.code) {
		b.code[at].x = to
	}
}

func (b *builder) patchY(at, to int32) {
	if int(at) < len(b.code) {
		b.code[at].y = to
	}
}

// call emits a call of the rule for s of kind (compiled once, later).
func (b *builder) call(s *schema, kind int, sep bool) {
	key := ruleKey{s, kind<<1 | bit(sep)}
	at := b.emit(instr{op: opCall})
	b.calls = append(b.calls, callSite{at, key})
	if _, ok := b.rules[key]; !ok {
		b.rules[key] = -1
		b.pending = append(b.pending, pendingRule{key, sep})
	}
}

func bit(v bool) int {
	if v {
		return 1
	}
	return 0
}

// finish compiles the rules called and links the calls.
func (b *builder) finish() error {
	for len(b.pending) > 0 && b.err == nil {
		r := b.pending[0]
		b.pending = b.pending[1:]
		b.rules[r.key] = b.pc()
		s, kind := r.key.s, r.key.kind>>1
		switch kind {
		case ruleJSON:
			b.jsonBody(s, r.sep)
		case ruleArgs:
			b.argsBody(s)
		case ruleString:
			b.stringBody(s)
		case ruleKeyChars:
			b.keyBody()
		case ruleRaw:
			if s != nil && s.maxLength >= 0 {
				b.upTo(s.maxLength, b.utf8Char)
			} else {
				b.star(func() { b.rangeSym(0, 255) })
			}
		}
		b.emit(instr{op: opRet})
	}
	if b.err != nil {
		return b.err
	}
	for _, c := range b.calls {
		b.code[c.pc].x = b.rules[c.key]
	}
	return nil
}

// digits emits [0-9]{min,max}.
func (b *builder) digits(min, max int) {
	for range min {
		b.rangeSym('0', '9')
	}
	b.upTo(max-min, func() { b.rangeSym('0', '9') })
}

// number emits a JSON number (an integer when integer), at most MaxDigits
// digits to a part.
func (b *builder) number(integer bool) {
	b.opt(func() { b.sym('-') })
	b.alt(func() { b.sym('0') }, func() { b.rangeSym('1', '9'); b.digits(0, MaxDigits-1) })
	if integer {
		return
	}
	b.opt(func() { b.sym('.'); b.digits(1, MaxDigits) })
	b.opt(func() {
		b.sym('e', 'E')
		b.opt(func() { b.sym('+', '-') })
		b.digits(1, maxExp)
	})
}

// stringBody emits a JSON string: its characters well-formed UTF-8 (lead
// and continuation bytes) or escapes, at most s.maxLength of them when s
// bounds them.
func (b *builder) stringBody(s *schema) {
	b.sym('"')
	var plain class
	for c := 0x20; c < 0x80; c++ {
		if c != '"' && c != '\\' {
			plain.set(c)
		}
	}
	char := func() {
		b.alt(
			func() { b.classSym(plain) },
			func() {
				b.sym('\\')
				b.alt(func() { b.sym('"', '\\', '/', 'b', 'f', 'n', 'r', 't') }, func() {
					b.sym('u')
					for range 4 {
						b.hex()
					}
				})
			},
			b.multiByte,
		)
	}
	if s != nil && s.maxLength >= 0 {
		b.upTo(s.maxLength, char)
	} else {
		b.star(char)
	}
	b.sym('"')
}

// multiByte emits one well-formed UTF-8 sequence of two to four bytes, as
// RFC 3629 defines them: no overlong forms, no surrogates, nothing above
// U+10FFFF (a decoder would read each such byte as U+FFFD, one character
// more than the grammar counted).
func (b *builder) multiByte() {
	b.alt(
		func() { b.rangeSym(0xC2, 0xDF); b.cont() },
		func() { b.sym(0xE0); b.rangeSym(0xA0, 0xBF); b.cont() },
		func() { b.rangeSym(0xE1, 0xEC); b.cont(); b.cont() },
		func() { b.sym(0xED); b.rangeSym(0x80, 0x9F); b.cont() },
		func() { b.rangeSym(0xEE, 0xEF); b.cont(); b.cont() },
		func() { b.sym(0xF0); b.rangeSym(0x90, 0xBF); b.cont(); b.cont() },
		func() { b.rangeSym(0xF1, 0xF3); b.cont(); b.cont(); b.cont() },
		func() { b.sym(0xF4); b.rangeSym(0x80, 0x8F); b.cont(); b.cont() },
	)
}

// utf8Char emits one character of a raw string: an ASCII byte or a
// well-formed multi-byte sequence.
func (b *builder) utf8Char() {
	b.alt(func() { b.rangeSym(0, 0x7F) }, b.multiByte)
}

func (b *builder) cont() { b.rangeSym(0x80, 0xBF) }

func (b *builder) hex() {
	var c class
	for _, r := range "0123456789abcdefABCDEF" {
		c.set(int(r))
	}
	b.classSym(c)
}

// keyBody emits a free argument key: [A-Za-z0-9_.-]+.
func (b *builder) keyBody() {
	var c class
	for _, r := range "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-" {
		c.set(int(r))
	}
	b.classSym(c)
	b.star(func() { b.classSym(c) })
}

// enum emits one of the literal texts.
func (b *builder) enum(texts []string) {
	var fs []func()
	for _, t := range texts {
		fs = append(fs, func() { b.lit(t) })
	}
	b.alt(fs...)
}

// jsonBody emits a JSON value valid against s; sep: the renderer's
// separators (", " and ": "), else an optional space after each.
func (b *builder) jsonBody(s *schema, sep bool) {
	if len(s.anyOf) > 0 {
		var fs []func()
		for _, sub := range s.anyOf {
			if s.types != tAny || s.enum != nil {
				sub = conj(s, sub)
			}
			fs = append(fs, func() { b.call(sub, ruleJSON, sep) })
		}
		b.alt(fs...)
		return
	}
	if s.enum != nil {
		var texts []string
		for _, e := range s.enum {
			texts = append(texts, e.json)
		}
		b.enum(texts)
		return
	}
	var fs []func()
	if s.types&tString != 0 {
		fs = append(fs, func() { b.call(lengthRule(s), ruleString, false) })
	}
	if s.types&(tNumber|tInteger) != 0 {
		fs = append(fs, func() { b.number(s.types&tNumber == 0) })
	}
	if s.types&tBoolean != 0 {
		fs = append(fs, func() { b.lit("true") }, func() { b.lit("false") })
	}
	if s.types&tNull != 0 {
		fs = append(fs, func() { b.lit("null") })
	}
	if s.types&tObject != 0 {
		fs = append(fs, func() { b.object(s, sep) })
	}
	if s.types&tArray != 0 {
		fs = append(fs, func() { b.array(s, sep) })
	}
	if len(fs) == 0 {
		b.err = fmt.Errorf("grammar: a schema allows no value")
		return
	}
	b.alt(fs...)
}

// conj narrows an anyOf branch by its parent's type and enum.
func conj(parent, sub *schema) *schema {
	c := *sub
	c.types &= parent.types
	if parent.enum != nil {
		if c.enum == nil {
			c.enum = filterKinds(parent.enum, c.types)
		} else {
			c.enum = intersect(c.enum, parent.enum)
		}
	}
	return &c
}

func (b *builder) comma(sep bool) {
	b.sym(',')
	if sep {
		b.sym(' ')
	} else {
		b.opt(func() { b.sym(' ') })
	}
}

func (b *builder) colon(sep bool) {
	b.sym(':')
	if sep {
		b.sym(' ')
	} else {
		b.opt(func() { b.sym(' ') })
	}
}

// object emits a JSON object: the declared properties in the schema's
// order (required ones present), or free keys when none are declared.
func (b *builder) object(s *schema, sep bool) {
	b.sym('{')
	if len(s.props) == 0 {
		if s.addl != nil {
			pair := func() {
				b.call(nil, ruleString, false)
				b.colon(sep)
				b.call(s.addl, ruleJSON, sep)
			}
			b.opt(func() { pair(); b.star(func() { b.comma(sep); pair() }) })
		}
		b.sym('}')
		return
	}
	// Two tracks: none written yet (no comma before the next), some
	// written. none[i] and some[i] are where property i is considered.
	n := len(s.props)
	none, some := make([]int32, n+1), make([]int32, n+1)
	var jumps []struct {
		at   int32
		to   int
		some bool
	}
	jump := func(to int, toSome bool) {
		jumps = append(jumps, struct {
			at   int32
			to   int
			some bool
		}{b.emit(instr{op: opJmp}), to, toSome})
	}
	for i, p := range s.props {
		for _, track := range []bool{false, true} {
			if track {
				some[i] = b.pc()
			} else {
				none[i] = b.pc()
			}
			write := func() {
				if track {
					b.comma(sep)
				}
				b.lit(pyquote.Quote(p.name))
				b.colon(sep)
				b.call(p.s, ruleJSON, sep)
				jump(i+1, true)
			}
			if p.required {
				write()
			} else {
				b.alt(write, func() { jump(i+1, track) })
			}
		}
	}
	end := b.pc()
	none[n], some[n] = end, end
	b.sym('}')
	for _, j := range jumps {
		to := none[j.to]
		if j.some {
			to = some[j.to]
		}
		b.patchX(j.at, to)
	}
}

// array emits a JSON array of minItems..maxItems items.
func (b *builder) array(s *schema, sep bool) {
	items := s.items
	if items == nil {
		items = anySchema
	}
	item := func(first bool) {
		if !first {
			b.comma(sep)
		}
		b.call(items, ruleJSON, sep)
	}
	b.sym('[')
	for i := range s.minItems {
		item(i == 0)
	}
	rest := func() {
		if s.maxItems < 0 {
			b.star(func() { item(false) })
		} else {
			b.upTo(s.maxItems-max(s.minItems, 1), func() { item(false) })
		}
	}
	if s.minItems == 0 {
		if s.maxItems != 0 {
			b.opt(func() { item(true); rest() })
		}
	} else {
		rest()
	}
	b.sym(']')
}

// element emits <|open|>HEAD<|sep|>.
func (b *builder) open(head string) {
	b.sym(symOpen)
	b.lit(head)
	b.sym(symSep)
}

func (b *builder) close(name string) {
	b.sym(symClose)
	b.lit(name)
	b.sym(symSep)
}

// argsBody emits a call's argument elements for the parameters schema s,
// the declared properties in order, or free keys when none are declared.
func (b *builder) argsBody(s *schema) {
	if len(s.props) == 0 {
		if s.addl != nil {
			b.star(func() {
				b.sym(symOpen)
				b.lit(`argument key="`)
				b.call(nil, ruleKeyChars, false)
				b.lit(`"`)
				b.argValue(s.addl)
			})
		}
		return
	}
	for _, p := range s.props {
		write := func() {
			b.sym(symOpen)
			b.lit(`argument key="` + attr(p.name) + `"`)
			b.argValue(p.s)
		}
		if p.required {
			write()
		} else {
			b.opt(write)
		}
	}
}

// argValue emits ` type="T"<|sep|>VALUE<|close|>argument<|sep|>` for a
// value valid against s: a string raw, others as the renderer writes
// JSON.
func (b *builder) argValue(s *schema) {
	var fs []func()
	for _, br := range branches(s) {
		t := br.types
		var texts []string // the string values allowed, with an enum
		for _, e := range br.enum {
			if e.kind == tString {
				texts = append(texts, e.str)
			}
		}
		if t&tString != 0 && (br.enum == nil || len(texts) > 0) {
			fs = append(fs, func() {
				b.lit(` type="string"`)
				b.sym(symSep)
				if br.enum != nil {
					b.enum(texts)
				} else {
					b.call(lengthRule(br), ruleRaw, false)
				}
			})
		}
		for _, tn := range []struct {
			bits uint8
			name string
		}{{tNumber | tInteger, "number"}, {tBoolean, "boolean"}, {tNull, "null"}, {tObject, "object"}, {tArray, "array"}} {
			if t&tn.bits == 0 {
				continue
			}
			sub := *br
			sub.types = t & tn.bits
			sub.anyOf = nil
			if br.enum != nil {
				sub.enum = filterKinds(br.enum, sub.types)
				if len(sub.enum) == 0 {
					continue
				}
			}
			fs = append(fs, func() {
				b.lit(` type="` + tn.name + `"`)
				b.sym(symSep)
				b.call(&sub, ruleJSON, true)
			})
		}
	}
	if len(fs) == 0 {
		b.err = fmt.Errorf("grammar: a schema allows no value")
		return
	}
	b.alt(fs...)
	b.close("argument")
}

// branches flattens s's anyOf into schemas without one.
// lengthRule is the schema a string rule is compiled for: s when it
// bounds the length, else nil (one rule shared by all unbounded strings).
func lengthRule(s *schema) *schema {
	if s.maxLength >= 0 {
		return s
	}
	return nil
}

func branches(s *schema) []*schema {
	if len(s.anyOf) == 0 {
		return []*schema{s}
	}
	var out []*schema
	for _, sub := range s.anyOf {
		out = append(out, branches(conj(s, sub))...)
	}
	return out
}

// compile emits the reply the spec allows, opened after the generation
// prompt.
func compile(spec *Spec) ([]instr, int32, error) {
	b := &builder{rules: map[ruleKey]int32{}}
	if spec.Thinking {
		b.star(func() { b.rangeSym(0, 255) })
		b.close("think")
		b.open("response")
	}
	switch spec.Mode {
	case ModeToolCall:
		var p schemaParser
		type tool struct {
			name string
			s    *schema
		}
		var tools []tool
		for _, t := range spec.Tools {
			if spec.Tool != "" && t.Name != spec.Tool {
				continue
			}
			s, err := p.parseSchema(t.Parameters)
			if err != nil {
				return nil, 0, fmt.Errorf("grammar: tool %q parameters: %w", t.Name, err)
			}
			if s.types&tObject == 0 || s.enum != nil || len(s.anyOf) > 0 {
				return nil, 0, fmt.Errorf("grammar: tool %q parameters: must be an object schema", t.Name)
			}
			tools = append(tools, tool{t.Name, s})
		}
		if len(tools) == 0 {
			return nil, 0, fmt.Errorf("grammar: no tool to call")
		}
		b.close("response")
		b.open("tools")
		callOne := func(i int) {
			var fs []func()
			for _, t := range tools {
				fs = append(fs, func() {
					b.open(`call tool="` + attr(t.name) + `" index="` + strconv.Itoa(i) + `"`)
					b.call(t.s, ruleArgs, false)
					b.close("call")
				})
			}
			b.alt(fs...)
		}
		callOne(1)
		var splits []int32
		for i := 2; i <= MaxCalls; i++ {
			splits = append(splits, b.emit(instr{op: opSplit, x: b.pc() + 1}))
			callOne(i)
		}
		for _, s := range splits {
			b.patchY(s, b.pc())
		}
		b.close("tools")
	case ModeJSONSchema, ModeJSONObject:
		s := &schema{types: tObject, maxItems: -1, addl: anySchema}
		if spec.Mode == ModeJSONSchema {
			var p schemaParser
			var err error
			if s, err = p.parseSchema(spec.Schema); err != nil {
				return nil, 0, fmt.Errorf("grammar: response schema: %w", err)
			}
		}
		b.call(s, ruleJSON, false)
		b.close("response")
	default:
		return nil, 0, fmt.Errorf("grammar: mode %q", spec.Mode)
	}
	b.close("message")
	eom := b.pc()
	b.sym(symEOM)
	b.emit(instr{op: opMatch})
	if err := b.finish(); err != nil {
		return nil, 0, err
	}
	return b.code, eom, nil
}
