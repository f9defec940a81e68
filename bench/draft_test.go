package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestDraftCommands: generate --draft lookup prints the ids --draft off
// does; decodegroup --forced-acceptance 1 --json accepts every draft
// (more than one token a step) and reports both rates of the same run.
func TestDraftCommands(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ctx := context.Background()
	gen := func(mode string) string {
		return captureStdout(t, func() error {
			return commands["generate"].run(ctx, []string{"--model", dir, "--ids", "5,17,200,5,17,200,5,17", "-n", "12", "--draft", mode})
		})
	}
	if on, off := gen("lookup"), gen("off"); on != off || strings.Count(on, ",") != 11 {
		t.Fatalf("generate --draft lookup printed %q, --draft off %q", on, off)
	}
	if err := commands["generate"].run(ctx, []string{"--model", dir, "--ids", "5", "--draft", "eagle"}); err == nil {
		t.Fatal("--draft eagle accepted")
	}
	out := captureStdout(t, func() error {
		return commands["decodegroup"].run(ctx, []string{"--model", dir, "--ranks", "2", "--seqs", "2", "--tokens", "16", "--forced-acceptance", "1", "--json"})
	})
	var rep struct {
		Results []forcedResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Results) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	r := rep.Results[0]
	if r.Drafted == 0 || r.Accepted != r.Drafted || r.TokensPerStep <= 1 || r.TokS <= 0 || r.TokSNoDraft <= 0 {
		t.Fatalf("forced acceptance 1: %+v", r)
	}
	if err := commands["decodegroup"].run(ctx, []string{"--model", dir, "--forced-acceptance", "1.5"}); err == nil {
		t.Fatal("--forced-acceptance 1.5 accepted")
	}
}
