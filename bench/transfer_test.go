package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestTransferConfigValidate: validate accepts the defaults and names the
// flag at fault.
func TestTransferConfigValidate(t *testing.T) {
	def, err := parseTransferFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*transferConfig)
		want string // "" for valid
	}{
		{"defaults", func(*transferConfig) {}, ""},
		{"no tokens", func(c *transferConfig) { c.tokens = 0 }, ""},
		{"negative tokens", func(c *transferConfig) { c.tokens = -1 }, "--tokens"},
		{"no ranks", func(c *transferConfig) { c.ranks = 0 }, "--ranks"},
		{"no conns", func(c *transferConfig) { c.conns = 0 }, "--conns"},
		{"no reps", func(c *transferConfig) { c.reps = 0 }, "--reps"},
		{"no limited layers", func(c *transferConfig) { c.limitedLayers = 0 }, "--limited-layers"},
		{"unknown transport", func(c *transferConfig) { c.transport = "udp" }, "--transport"},
		{"rdma-fake lossy", func(c *transferConfig) { c.transport, c.loss = "rdma-fake", 0.01 }, ""},
		{"rdma-fake all lost", func(c *transferConfig) { c.transport, c.loss = "rdma-fake", 1 }, "--loss"},
		{"rdma-fake negative loss", func(c *transferConfig) { c.transport, c.loss = "rdma-fake", -0.1 }, "--loss"},
		{"tcp ignores loss", func(c *transferConfig) { c.loss = 2 }, ""},
		{"tensor ranks", func(c *transferConfig) { c.ranks, c.tensor = 4, 2 }, ""},
		{"tensor not dividing the ranks", func(c *transferConfig) { c.ranks, c.tensor = 3, 2 }, "--tensor 2"},
		{"no tensor", func(c *transferConfig) { c.tensor = 0 }, "--tensor 0"},
		{"tensor over rdma-fake", func(c *transferConfig) { c.transport, c.tensor = "rdma-fake", 2 }, "--transport tcp only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := def
			tc.edit(&c)
			checkValidate(t, c.validate(), tc.want)
		})
	}
}

// TestTransferTensorRanks: bench transfer --tensor 2 moves each tensor
// rank its slice of a tiny state through real kvtransfer, faults
// included: nothing corrupt is committed, and the wire carries more than
// the state (the MLA rows go to both ranks of a stage).
func TestTransferTensorRanks(t *testing.T) {
	f, err := parseTransferFlags([]string{"--model", "tiny", "--ranks", "4", "--tensor", "2", "--tokens", "128", "--reps", "1", "--rate", "0", "--json"})
	if err != nil {
		t.Fatal(err)
	}
	out := captureStdout(t, func() error { return runTransfer(context.Background(), f) })
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var res transferResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("the last line %q: %v", lines[len(lines)-1], err)
	}
	if res.CorruptChunksCommitted != 0 || res.WireBytes <= res.StateBytes || res.StateBytes == 0 {
		t.Fatalf("tensor 2 transfer: %d corrupt chunks committed, %d wire bytes for a %d-byte state", res.CorruptChunksCommitted, res.WireBytes, res.StateBytes)
	}
}
