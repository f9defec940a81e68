package main

import "testing"

// TestAPIConfigValidate: validate accepts the defaults and names the flag
// at fault.
func TestAPIConfigValidate(t *testing.T) {
	def, err := parseAPIFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*apiConfig)
		want string // "" for valid
	}{
		{"defaults", func(*apiConfig) {}, ""},
		{"fewest pairs", func(c *apiConfig) { c.pairs = 10 }, ""},
		{"too few pairs", func(c *apiConfig) { c.pairs = 9 }, "--pairs"},
		{"no concurrent part", func(c *apiConfig) { c.concurrent = 0 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := def
			tc.edit(&c)
			checkValidate(t, c.validate(), tc.want)
		})
	}
}
