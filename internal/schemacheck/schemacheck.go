// Package schemacheck validates JSON values against the JSON-schema
// keywords that package grammar enforces, for tests.
package schemacheck

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Decode parses one JSON value, numbers as json.Number.
func Decode(s string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%q: %w", s, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%q: trailing data", s)
	}
	return v, nil
}

// Validate checks v (decoded with numbers as json.Number) against
// schema: type, enum, const, anyOf, properties, required,
// additionalProperties, items, minItems, maxItems and maxLength (in code
// points).
func Validate(schema, v any) error {
	s, ok := schema.(map[string]any)
	if !ok {
		return nil // true or absent
	}
	if t, ok := s["type"]; ok {
		types, ok := t.([]any)
		if !ok {
			types = []any{t}
		}
		match := false
		for _, tn := range types {
			match = match || hasType(tn.(string), v)
		}
		if !match {
			return fmt.Errorf("%v is not of type %v", v, t)
		}
	}
	if e, ok := s["enum"]; ok {
		found := false
		for _, ev := range e.([]any) {
			found = found || fmt.Sprint(ev) == fmt.Sprint(v)
		}
		if !found {
			return fmt.Errorf("%v not in enum %v", v, e)
		}
	}
	if c, ok := s["const"]; ok && fmt.Sprint(c) != fmt.Sprint(v) {
		return fmt.Errorf("%v is not const %v", v, c)
	}
	if alts, ok := s["anyOf"]; ok {
		var errs []string
		for _, a := range alts.([]any) {
			err := Validate(a, v)
			if err == nil {
				errs = nil
				break
			}
			errs = append(errs, err.Error())
		}
		if errs != nil {
			return fmt.Errorf("no anyOf branch: %v", errs)
		}
	}
	if obj, ok := v.(map[string]any); ok {
		props, _ := s["properties"].(map[string]any)
		for _, r := range asList(s["required"]) {
			if _, ok := obj[r.(string)]; !ok {
				return fmt.Errorf("required key %v missing in %v", r, obj)
			}
		}
		for k, val := range obj {
			ps, declared := props[k]
			if !declared {
				if s["additionalProperties"] == false {
					return fmt.Errorf("extra key %q", k)
				}
				ps = s["additionalProperties"]
			}
			if err := Validate(ps, val); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
	}
	if str, ok := v.(string); ok {
		if n, ok := s["maxLength"].(json.Number); ok {
			if max, _ := n.Int64(); utf8.RuneCountInString(str) > int(max) {
				return fmt.Errorf("%q is longer than maxLength %d", str, max)
			}
		}
	}
	if arr, ok := v.([]any); ok {
		if n, ok := s["minItems"].(json.Number); ok {
			if min, _ := n.Int64(); len(arr) < int(min) {
				return fmt.Errorf("%d items < minItems %d", len(arr), min)
			}
		}
		if n, ok := s["maxItems"].(json.Number); ok {
			if max, _ := n.Int64(); len(arr) > int(max) {
				return fmt.Errorf("%d items > maxItems %d", len(arr), max)
			}
		}
		for i, it := range arr {
			if err := Validate(s["items"], it); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
	}
	return nil
}

func asList(v any) []any { l, _ := v.([]any); return l }

func hasType(t string, v any) bool {
	switch v := v.(type) {
	case nil:
		return t == "null"
	case bool:
		return t == "boolean"
	case string:
		return t == "string"
	case json.Number:
		return t == "number" || t == "integer" && !strings.ContainsAny(string(v), ".eE")
	case map[string]any:
		return t == "object"
	case []any:
		return t == "array"
	}
	return false
}
