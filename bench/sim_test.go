package main

import (
	"strings"
	"testing"
)

// TestSimConfigValidate: validate accepts the defaults and names the flag
// at fault.
func TestSimConfigValidate(t *testing.T) {
	def, err := parseSimFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*simConfig)
		want string // "" for valid
	}{
		{"defaults", func(*simConfig) {}, ""},
		{"one length", func(c *simConfig) { c.lengths = "4096" }, ""},
		{"no length", func(c *simConfig) { c.lengths = " , " }, "--lengths"},
		{"bad length", func(c *simConfig) { c.lengths = "1000,abc" }, "--lengths"},
		{"zero length", func(c *simConfig) { c.lengths = "0" }, "--lengths"},
		{"huge length", func(c *simConfig) { c.lengths = "99999999" }, "--lengths"},
		{"some policies", func(c *simConfig) { c.policies = "local,auto" }, ""},
		{"unknown policy", func(c *simConfig) { c.policies = "local,fastest" }, "--policies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := def
			tc.edit(&c)
			checkValidate(t, c.validate(), tc.want)
		})
	}
}

// checkValidate fails t unless err is nil for want "" or else mentions want.
func checkValidate(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("validate: %v, want nil", err)
	case want != "" && err == nil:
		t.Errorf("validate: nil, want an error naming %s", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Errorf("validate: %v, want it to name %s", err, want)
	}
}
