package config

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// unknownField is how yaml reports a key no field takes.
var unknownField = regexp.MustCompile(`^line (\d+): field (.+) not found in type (\S+)$`)

// DecodeYAML decodes the YAML document b into v, a pointer to a struct
// with yaml tags, for files that map onto a Go type (bench's hardware
// profiles). A key no field takes is an error naming it, its line and the
// nearest key of the struct it is in; where (the file) prefixes errors.
// An empty document is io.EOF, as yaml reports it.
func DecodeYAML(where string, b []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	err := dec.Decode(v)
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	keys := structKeys(reflect.TypeOf(v), map[string][]string{})
	for _, e := range te.Errors {
		m := unknownField.FindStringSubmatch(e)
		if m == nil {
			continue
		}
		line, _ := strconv.Atoi(m[1])
		known := keys[m[3]]
		if n := Nearest(m[2], known); n != "" {
			return fmt.Errorf("%s line %d: unknown key %q (did you mean %s?)", where, line, m[2], n)
		}
		return fmt.Errorf("%s line %d: unknown key %q (valid keys here: %s)", where, line, m[2], strings.Join(sorted(known), ", "))
	}
	return fmt.Errorf("%s: %w", where, err)
}

// structKeys maps the name of every struct type reachable from t (as
// yaml's errors print it, package.Type) to its yaml keys.
func structKeys(t reflect.Type, out map[string][]string) map[string][]string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return out
	}
	name := t.String()
	if _, seen := out[name]; seen {
		return out
	}
	out[name] = []string{}
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || tag == "-" {
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		keys = append(keys, tag)
		structKeys(f.Type, out)
	}
	out[name] = keys
	return out
}
