package main

import "testing"

// TestMkmodelConfigValidate: validate accepts a preset or a --config file
// and names --preset when the preset is unknown.
func TestMkmodelConfigValidate(t *testing.T) {
	def, err := parseMkmodelFlags([]string{"--out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*mkmodelConfig)
		want string // "" for valid
	}{
		{"defaults", func(*mkmodelConfig) {}, ""},
		{"k3", func(c *mkmodelConfig) { c.preset, c.sparse = "k3", true }, ""},
		{"unknown preset", func(c *mkmodelConfig) { c.preset = "huge" }, "--preset"},
		{"config file", func(c *mkmodelConfig) { c.preset, c.config = "huge", "config.json" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := def
			tc.edit(&c)
			checkValidate(t, c.validate(), tc.want)
		})
	}
	if _, err := parseMkmodelFlags(nil); err == nil {
		t.Error("no --out: accepted")
	}
}
