package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestHelpLayout: --help succeeds and explains the layout: pipeline x
// tensor, the rank numbering, what a tensor rank holds, the links a stage
// needs besides the ring, and the constraint on tensor.
func TestHelpLayout(t *testing.T) {
	var out bytes.Buffer
	cmd := command(&out, &out, func(*cobra.Command, *workerConfig) error {
		t.Fatal("--help ran the worker")
		return nil
	})
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("--help: %v", err)
	}
	text := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{
		"pipeline stages x tensor ranks per stage",
		"rank = stage*tensor + t",
		"1/tensor of each of the stage's layers",
		"KDA and MLA heads",
		"the pipeline ring (rank r to r+1, the last rank back to 0)",
		"reach its stage's other ranks",
		"tensor must divide the model's KDA heads and its MLA heads",
		"rdma-probe --group-config FILE --rank R",
		"--group-config",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("--help does not say %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(text, "tensor 1 only") {
		t.Errorf("--help still restricts the pipeline to tensor 1")
	}
}
