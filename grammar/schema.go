package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tandem-inference/tandem/internal/pyquote"
)

// Limits on a schema: it comes from a client.
const (
	MaxSchemaDepth = 16   // nesting of schemas within schemas
	MaxSchemaNodes = 4096 // schemas within all of a Spec's schemas
	MaxEnum        = 256  // values of one enum
	MaxItemsBound  = 64   // minItems and a finite maxItems at most
	MaxLengthBound = 256  // a string's maxLength enforced at most
)

// JSON types a schema names, as bits.
const (
	tString = 1 << iota
	tNumber
	tInteger
	tBoolean
	tNull
	tObject
	tArray
	tAny = tString | tNumber | tInteger | tBoolean | tNull | tObject | tArray
)

var typeBits = map[string]uint8{
	"string": tString, "number": tNumber, "integer": tInteger, "boolean": tBoolean,
	"null": tNull, "object": tObject, "array": tArray,
}

// schema is a JSON schema node, the part the grammar enforces.
type schema struct {
	types uint8    // allowed types (tAny when the schema says none)
	enum  []scalar // allowed values (enum, const); nil: any of the types
	props []prop   // properties in the schema's order
	// addl is the schema of keys beyond props: nil when additionalProperties
	// is false or props are declared (the grammar writes declared keys
	// only), else the value schema (any value when not given).
	addl     *schema
	items    *schema // nil: any items
	minItems int
	maxItems int // -1: unbounded
	// maxLength bounds a string's characters (Unicode code points; a
	// JSON escape counts as one); -1: unbounded.
	maxLength int
	anyOf     []*schema
}

type prop struct {
	name     string
	s        *schema
	required bool
}

// scalar is an enum value: its kind (one type bit), its JSON text, and for
// a string its value.
type scalar struct {
	kind uint8
	json string
	str  string
}

var anySchema = &schema{types: tAny, maxItems: -1, maxLength: -1}

// Keywords that change what is valid but are not enforced: refused.
var unsupported = map[string]bool{
	"$ref": true, "$defs": true, "definitions": true, "allOf": true, "not": true, "if": true, "then": true,
	"else": true, "patternProperties": true, "prefixItems": true, "dependentRequired": true,
	"dependentSchemas": true, "propertyNames": true, "unevaluatedProperties": true,
	"unevaluatedItems": true, "contains": true,
}

// ordered is a parsed JSON value with object keys in their order.
type ordered struct {
	keys []string
	vals []any
}

func (o *ordered) get(k string) (any, bool) {
	for i, key := range o.keys {
		if key == k {
			return o.vals[i], true
		}
	}
	return nil, false
}

// parseJSON parses raw keeping object keys in order (numbers as
// json.Number), at most MaxSchemaDepth*4 levels deep.
func parseJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := parseValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the schema")
	}
	return v, nil
}

func parseValue(dec *json.Decoder, depth int) (any, error) {
	if depth > MaxSchemaDepth*4 {
		return nil, fmt.Errorf("nested more than %d levels", MaxSchemaDepth*4)
	}
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		o := &ordered{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := parseValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			o.keys, o.vals = append(o.keys, k.(string)), append(o.vals, v)
		}
		_, err := dec.Token()
		return o, err
	case json.Delim('['):
		var a []any
		for dec.More() {
			v, err := parseValue(dec, depth+1)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token()
		return a, err
	}
	return t, nil
}

// schemaParser turns parsed schemas into schema nodes, counting them.
type schemaParser struct{ nodes int }

// parseSchema reads a schema; an absent or null one accepts anything.
func (p *schemaParser) parseSchema(raw json.RawMessage) (*schema, error) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return anySchema, nil
	}
	v, err := parseJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	return p.node(v, 0, "#")
}

func (p *schemaParser) node(v any, depth int, at string) (*schema, error) {
	p.nodes++
	switch {
	case p.nodes > MaxSchemaNodes:
		return nil, fmt.Errorf("more than %d schemas", MaxSchemaNodes)
	case depth > MaxSchemaDepth:
		return nil, fmt.Errorf("%s: schemas nested more than %d levels", at, MaxSchemaDepth)
	}
	if b, ok := v.(bool); ok && b {
		return anySchema, nil
	}
	o, ok := v.(*ordered)
	if !ok {
		return nil, fmt.Errorf("%s: a schema must be an object or true", at)
	}
	s := &schema{types: tAny, maxItems: -1, maxLength: -1}
	for i, k := range o.keys {
		if unsupported[k] {
			return nil, fmt.Errorf("%s: keyword %q is not supported", at, k)
		}
		val := o.vals[i]
		switch k {
		case "type":
			s.types = 0
			names, ok := val.([]any)
			if !ok {
				names = []any{val}
			}
			for _, n := range names {
				str, _ := n.(string)
				bit, ok := typeBits[str]
				if !ok {
					return nil, fmt.Errorf("%s: unknown type %v", at, n)
				}
				s.types |= bit
			}
			if s.types == 0 {
				return nil, fmt.Errorf("%s: empty type list", at)
			}
		case "enum", "const":
			vals, ok := val.([]any)
			if k == "const" {
				vals = []any{val}
			} else if !ok || len(vals) == 0 {
				return nil, fmt.Errorf("%s: enum must be a non-empty array", at)
			}
			if len(vals) > MaxEnum {
				return nil, fmt.Errorf("%s: enum has %d values, at most %d", at, len(vals), MaxEnum)
			}
			var enum []scalar
			for _, ev := range vals {
				sc, err := toScalar(ev)
				if err != nil {
					return nil, fmt.Errorf("%s/%s: %w", at, k, err)
				}
				enum = append(enum, sc)
			}
			if s.enum != nil { // enum and const: both hold
				enum = intersect(s.enum, enum)
			}
			s.enum = enum
		}
	}
	if s.enum != nil {
		s.enum = filterKinds(s.enum, s.types)
		if len(s.enum) == 0 {
			return nil, fmt.Errorf("%s: no enum value has an allowed type", at)
		}
	}
	if pv, ok := o.get("properties"); ok {
		po, ok := pv.(*ordered)
		if !ok {
			return nil, fmt.Errorf("%s: properties must be an object", at)
		}
		for i, name := range po.keys {
			ps, err := p.node(po.vals[i], depth+1, at+"/properties/"+name)
			if err != nil {
				return nil, err
			}
			s.props = append(s.props, prop{name: name, s: ps})
		}
	}
	if rv, ok := o.get("required"); ok {
		names, ok := rv.([]any)
		if !ok {
			return nil, fmt.Errorf("%s: required must be an array", at)
		}
	next:
		for _, n := range names {
			name, _ := n.(string)
			for i := range s.props {
				if s.props[i].name == name {
					s.props[i].required = true
					continue next
				}
			}
			if len(s.props) > 0 {
				return nil, fmt.Errorf("%s: required key %v is not among the properties", at, n)
			}
			// Required keys of an object without properties: declared as
			// any value.
			s.props = append(s.props, prop{name: name, s: anySchema, required: true})
		}
	}
	if len(s.props) == 0 {
		s.addl = anySchema
		if av, ok := o.get("additionalProperties"); ok {
			switch av := av.(type) {
			case bool:
				if !av {
					s.addl = nil
				}
			default:
				as, err := p.node(av, depth+1, at+"/additionalProperties")
				if err != nil {
					return nil, err
				}
				s.addl = as
			}
		}
	}
	if iv, ok := o.get("items"); ok {
		if _, tuple := iv.([]any); tuple {
			return nil, fmt.Errorf("%s: tuple items are not supported", at)
		}
		is, err := p.node(iv, depth+1, at+"/items")
		if err != nil {
			return nil, err
		}
		s.items = is
	}
	var err error
	if s.minItems, err = bound(o, "minItems", 0); err != nil {
		return nil, fmt.Errorf("%s: %w", at, err)
	}
	if s.maxItems, err = bound(o, "maxItems", -1); err != nil {
		return nil, fmt.Errorf("%s: %w", at, err)
	}
	if s.maxLength, err = lengthBound(o); err != nil {
		return nil, fmt.Errorf("%s: %w", at, err)
	}
	if s.maxItems >= 0 && s.maxItems < s.minItems {
		return nil, fmt.Errorf("%s: maxItems %d < minItems %d", at, s.maxItems, s.minItems)
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		av, ok := o.get(k)
		if !ok {
			continue
		}
		list, ok := av.([]any)
		if !ok || len(list) == 0 {
			return nil, fmt.Errorf("%s: %s must be a non-empty array", at, k)
		}
		if s.anyOf != nil {
			return nil, fmt.Errorf("%s: both anyOf and oneOf", at)
		}
		for i, sub := range list {
			ss, err := p.node(sub, depth+1, fmt.Sprintf("%s/%s/%d", at, k, i))
			if err != nil {
				return nil, err
			}
			s.anyOf = append(s.anyOf, ss)
		}
	}
	return s, nil
}

// bound reads a non-negative integer keyword of at most MaxItemsBound.
func bound(o *ordered, key string, def int) (int, error) {
	v, ok := o.get(key)
	if !ok {
		return def, nil
	}
	n, ok := v.(json.Number)
	i, err := n.Int64()
	if !ok || err != nil || i < 0 {
		return 0, fmt.Errorf("%s must be a non-negative integer", key)
	}
	if i > MaxItemsBound {
		if key == "maxItems" {
			return -1, nil // as good as unbounded
		}
		return 0, fmt.Errorf("%s %d: at most %d supported", key, i, MaxItemsBound)
	}
	return int(i), nil
}

// lengthBound reads maxLength: -1 when absent or above MaxLengthBound
// (not enforced: the automaton would grow with it).
func lengthBound(o *ordered) (int, error) {
	v, ok := o.get("maxLength")
	if !ok {
		return -1, nil
	}
	n, ok := v.(json.Number)
	i, err := n.Int64()
	if !ok || err != nil || i < 0 {
		return 0, fmt.Errorf("maxLength must be a non-negative integer")
	}
	if i > MaxLengthBound {
		return -1, nil
	}
	return int(i), nil
}

func toScalar(v any) (scalar, error) {
	switch v := v.(type) {
	case nil:
		return scalar{kind: tNull, json: "null"}, nil
	case bool:
		if v {
			return scalar{kind: tBoolean, json: "true"}, nil
		}
		return scalar{kind: tBoolean, json: "false"}, nil
	case string:
		return scalar{kind: tString, json: pyquote.Quote(v), str: v}, nil
	case json.Number:
		kind := uint8(tNumber)
		if !strings.ContainsAny(string(v), ".eE") {
			kind |= tInteger
		}
		return scalar{kind: kind, json: string(v)}, nil
	}
	return scalar{}, errors.New("only strings, numbers, booleans and null are supported as enum values")
}

func intersect(a, b []scalar) []scalar {
	var out []scalar
	for _, x := range a {
		for _, y := range b {
			if x.json == y.json {
				out = append(out, x)
				break
			}
		}
	}
	return out
}

func filterKinds(e []scalar, types uint8) []scalar {
	out := []scalar{}
	for _, sc := range e {
		if sc.kind&types != 0 {
			out = append(out, sc)
		}
	}
	return out
}

// attr is s escaped as the renderer writes an attribute value.
func attr(s string) string {
	return strings.NewReplacer("&", "&amp;", `"`, "&quot;").Replace(s)
}
