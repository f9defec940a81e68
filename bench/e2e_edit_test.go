package main

import (
	"context"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/tokenizer"
)

// Each edit job's prompt holds its passage, which the reply is asked to
// repeat with a few words changed.
func TestEditJobs(t *testing.T) {
	dir := t.TempDir()
	if err := tokenizer.WriteSynthetic(dir, 2048, nil); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := editJobs(tok, 3, 40, 32, 7)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := editJobs(tok, 3, 40, 32, 7)
	decode := func(ids []int32) string {
		out := make([]int, len(ids))
		for i, id := range ids {
			out[i] = int(id)
		}
		s, err := tok.DecodeString(out)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for i, j := range jobs {
		if err := j.Validate(); err != nil {
			t.Fatal(err)
		}
		text := decode(j.Tokens)
		if !strings.Contains(text, "Rewrite this passage") || j.Prompt < 40 || j.Output != 32 {
			t.Errorf("job %s: %d tokens, output %d: %q", j.ID, j.Prompt, j.Output, text)
		}
		if decode(again[i].Tokens) != text {
			t.Errorf("job %s: the same seed built another prompt", j.ID)
		}
	}
}

// The edit workload end to end: the replies with lookup drafts and with
// forced drafts equal those without (checked by runEdit), and forced
// drafts that are always right are all accepted.
func TestEditWorkloadWithForcedDrafts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole system twice (-short)")
	}
	f, err := parseE2EFlags([]string{"--preset", "demo", "--workload", "edit", "--edit-jobs", "1", "--edit-output", "24",
		"--warmup", "0", "--probe", "0", "--forced-acceptance", "1,0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.validate(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r, err := loadE2E(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.startSystem(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.close()
	out, err := r.runEdit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !out.OutputsEqual || len(out.Forced) != 2 || out.TokSNoDraft <= 0 {
		t.Fatalf("%+v", out)
	}
	if all := out.Forced[0]; all.Accepted == 0 || all.Accepted != all.Drafted {
		t.Errorf("drafts that are always right: %d of %d accepted", all.Accepted, all.Drafted)
	}
	if none := out.Forced[1]; none.Accepted != 0 {
		t.Errorf("drafts that are always wrong: %d of %d accepted", none.Accepted, none.Drafted)
	}
	for _, bad := range [][]string{{"--workload", "edit", "--forced-acceptance", "1.5"}, {"--workload", "edit", "--edit-jobs", "0"}} {
		f, err := parseE2EFlags(bad)
		if err == nil {
			err = f.validate()
		}
		if err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
