package main

import "testing"

// TestStreamConfigValidate: validate accepts the defaults with a model and
// names the flag at fault.
func TestStreamConfigValidate(t *testing.T) {
	def, err := parseStreamFlags([]string{"--model", "ckpt"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*streamConfig)
		want string // "" for valid
	}{
		{"defaults", func(*streamConfig) {}, ""},
		{"no model", func(c *streamConfig) { c.model = "" }, "--model"},
		{"no reps", func(c *streamConfig) { c.reps = 0 }, "--reps"},
		{"one-token prompt", func(c *streamConfig) { c.promptLen = 1 }, "--prompt-len"},
		{"no prompts", func(c *streamConfig) { c.prompts = 0 }, "--prompts"},
		{"f32 cache", func(c *streamConfig) { c.cache = "f32" }, ""},
		{"f16 cache", func(c *streamConfig) { c.cache = "f16" }, "--cache-dtype"},
		{"budget not a size", func(c *streamConfig) { c.budget = "lots" }, "--memory-budget"},
		{"read size not a size", func(c *streamConfig) { c.readSize = "8 furlongs" }, "--read-size"},
		{"buffered io", func(c *streamConfig) { c.io = "buffered" }, ""},
		{"unknown io", func(c *streamConfig) { c.io = "mmap" }, "--io"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := def
			tc.edit(&c)
			checkValidate(t, c.validate(), tc.want)
		})
	}
}
