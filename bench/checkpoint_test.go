package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model/layout"
)

// TestCheckpointCommands: bench checkpoint shards lists the shards of the
// first of three decode ranks (its layers and the model-level tensors) and
// copies those of the middle rank; verify passes on the copy for that rank
// and fails for the whole model; bad ranges and subcommands are errors.
func TestCheckpointCommands(t *testing.T) {
	src := testmodel.Dir(t, "tiny", 1, 0)
	ctx := context.Background()
	out := captureStdout(t, func() error {
		return commands["checkpoint"].run(ctx, []string{"shards", "--rank", "0", "--ranks", "3", src})
	})
	want, err := layout.Needed(src, layout.Range{Lo: 0, Hi: 3, Globals: true})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(want) {
		t.Fatalf("shards printed %d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i, s := range want {
		if !strings.HasPrefix(lines[i], s.File+"\t") {
			t.Fatalf("line %d %q, want shard %s", i, lines[i], s.File)
		}
	}
	dst := filepath.Join(t.TempDir(), "rank1")
	captureStdout(t, func() error {
		return commands["checkpoint"].run(ctx, []string{"shards", "--rank", "1", "--ranks", "3", "--copy", dst, src})
	})
	if _, err := os.Stat(filepath.Join(dst, layout.CopyFile)); err != nil {
		t.Fatal(err)
	}
	if out := captureStdout(t, func() error {
		return commands["checkpoint"].run(ctx, []string{"verify", "--rank", "1", "--ranks", "3", dst})
	}); !strings.Contains(out, "verified") {
		t.Fatalf("verify of the copied rank: %q", out)
	}
	err = commands["checkpoint"].run(ctx, []string{"verify", "--layers", "0-8", "--globals", dst})
	if err == nil || !strings.Contains(err.Error(), "problems") {
		t.Fatalf("verify of the whole model on a rank's copy: %v", err)
	}
	for _, bad := range [][]string{{"verify", "--layers", "5-2", src}, {"verify", "--rank", "3", "--ranks", "3", src}, {"frob", src}, {"verify"}} {
		if err := commands["checkpoint"].run(ctx, bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestCheckpointConfigValidate: validate takes one way of naming a range
// and names the flags at fault.
func TestCheckpointConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" for valid
	}{
		{[]string{"verify", "dir"}, ""},
		{[]string{"verify", "--layers", "2-4", "dir"}, ""},
		{[]string{"verify", "--layers", "3", "--globals", "dir"}, ""},
		{[]string{"verify", "--layers", "4-2", "dir"}, "--layers"},
		{[]string{"verify", "--layers", "a-b", "dir"}, "--layers"},
		{[]string{"shards", "--rank", "2", "--ranks", "3", "dir"}, ""},
		{[]string{"shards", "--rank", "3", "--ranks", "3", "dir"}, "--rank 3 --ranks 3"},
		{[]string{"shards", "--rank", "1", "dir"}, "--ranks"},
		{[]string{"shards", "--ranks", "3", "dir"}, "--rank"},
		{[]string{"shards", "--layers", "1", "--ranks", "3", "dir"}, "not both"},
		{[]string{"shards", "--globals", "dir"}, "--globals"},
	} {
		c, err := parseCheckpointFlags(tc.args)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) { checkValidate(t, c.validate(), tc.want) })
	}
}
