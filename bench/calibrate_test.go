package main

import "testing"

// TestCalibrateConfigValidate: validate accepts the defaults and names the
// flag at fault.
func TestCalibrateConfigValidate(t *testing.T) {
	def, err := parseCalibrateFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*calibrateConfig)
		want string // "" for valid
	}{
		{"defaults", func(*calibrateConfig) {}, ""},
		{"no threads", func(c *calibrateConfig) { c.threads = 0 }, "--threads"},
		{"no ranks", func(c *calibrateConfig) { c.ranks = 0 }, "--ranks"},
		{"no reps", func(c *calibrateConfig) { c.reps = 0 }, "--reps"},
		{"budget not a size", func(c *calibrateConfig) { c.budget = "2 gigs" }, "--memory-budget"},
		{"one length", func(c *calibrateConfig) { c.tokens = "256" }, ""},
		{"bad length", func(c *calibrateConfig) { c.tokens = "128,x" }, "--tokens"},
		{"no length", func(c *calibrateConfig) { c.tokens = "" }, "--tokens"},
		{"direct io", func(c *calibrateConfig) { c.io = "direct" }, ""},
		{"unknown io", func(c *calibrateConfig) { c.io = "mmap" }, "--io"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := def
			tc.edit(&c)
			checkValidate(t, c.validate(), tc.want)
		})
	}
}
