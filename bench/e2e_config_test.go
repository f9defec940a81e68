package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestE2EConfigValidate: validate accepts the defaults and names the flag
// at fault.
func TestE2EConfigValidate(t *testing.T) {
	def, err := parseE2EFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*e2eConfig)
		want string // "" for valid
	}{
		{"defaults", func(*e2eConfig) {}, ""},
		{"some policies", func(c *e2eConfig) { c.policies = "auto,local" }, ""},
		{"unknown policy", func(c *e2eConfig) { c.policies = "local,fastest" }, "--policies"},
		{"threshold policy", func(c *e2eConfig) { c.policies = "threshold" }, "--policies"},
		{"no policy", func(c *e2eConfig) { c.policies = " , " }, "--policies"},
		{"zero job timeout", func(c *e2eConfig) { c.jobTimeout = 0 }, "--job-timeout"},
		{"negative job timeout", func(c *e2eConfig) { c.jobTimeout = -time.Second }, "--job-timeout"},
		{"zero tolerance", func(c *e2eConfig) { c.tolerance = 0 }, "--tolerance"},
		{"short seed", func(c *e2eConfig) { c.seedTokens = 1 }, "--seed-tokens"},
		{"zero threshold", func(c *e2eConfig) { c.threshold = 0 }, "--threshold"},
		{"no rounds", func(c *e2eConfig) { c.rounds = 0 }, "--rounds"},
		{"negative warmup", func(c *e2eConfig) { c.warmup = -1 }, "--warmup"},
		{"negative probe", func(c *e2eConfig) { c.probeReps = -1 }, "--probe"},
		{"negative ranks", func(c *e2eConfig) { c.ranks = -2 }, "--ranks"},
		{"negative threads", func(c *e2eConfig) { c.threads = -1 }, "--threads"},
		{"no probe", func(c *e2eConfig) { c.probeReps = 0 }, ""},
		{"chat agent", func(c *e2eConfig) { c.chat, c.workload = true, "agent" }, ""},
		{"chat mix", func(c *e2eConfig) { c.chat = true }, "--workload agent"},
		{"chat trace", func(c *e2eConfig) { c.chat, c.workload, c.trace = true, "agent", "t.jsonl" }, "--trace"},
		{"link rate", func(c *e2eConfig) { c.linkRate = "50MB" }, ""},
		{"bad link rate", func(c *e2eConfig) { c.linkRate = "fast" }, "--link-rate"},
		{"zero link rate", func(c *e2eConfig) { c.linkRate = "0" }, "--link-rate"},
		{"ladder", func(c *e2eConfig) { c.workload = "ladder" }, ""},
		{"bad ladder", func(c *e2eConfig) { c.workload, c.ladder = "ladder", "64,x" }, "--ladder"},
		{"ladder of one token", func(c *e2eConfig) { c.workload, c.ladder = "ladder", "1,64" }, "--ladder"},
		{"ladder unused", func(c *e2eConfig) { c.ladder = "x" }, ""},
		{"bad warmup prompts", func(c *e2eConfig) { c.warmupPrompts = "128,0" }, "--warmup-prompts"},
		{"cache policy", func(c *e2eConfig) { c.workload, c.cachePolicy = "agent", "remote" }, ""},
		{"bad cache policy", func(c *e2eConfig) { c.workload, c.cachePolicy = "agent", "threshold" }, "--cache-policy"},
		{"cache policy unused", func(c *e2eConfig) { c.workload, c.cachePolicy, c.cacheCompare = "agent", "x", false }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := def
			tc.edit(&c)
			checkValidate(t, c.validate(), tc.want)
		})
	}
}

// TestE2EFlags: the flags land in the configuration with the command
// line kept for the report; --help is pflag.ErrHelp (success); stray
// arguments are refused before anything runs.
func TestE2EFlags(t *testing.T) {
	args := []string{"--workload", "ladder", "--ladder", "64,128", "--rounds", "2", "--budget", "1GiB", "--json"}
	c, err := parseE2EFlags(args)
	if err != nil {
		t.Fatal(err)
	}
	if c.workload != "ladder" || c.ladder != "64,128" || c.rounds != 2 || c.budget != "1GiB" || !c.asJSON || !c.inTurn() || len(c.args) != len(args) {
		t.Fatalf("config %+v", c)
	}
	if _, err := parseE2EFlags([]string{"--help"}); !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("--help: %v, want pflag.ErrHelp", err)
	}
	if err := commands["e2e"].run(context.Background(), []string{"stray"}); err == nil {
		t.Fatal("a stray argument was accepted")
	}
}
