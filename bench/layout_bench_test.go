package main

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// TestGenerateLayoutsMatchOneRank: generate --pipeline P --tensor T, a
// decode group of P stages of T ranks in this process, prints the ids of
// one rank (the monolithic model).
func TestGenerateLayoutsMatchOneRank(t *testing.T) {
	ctx := context.Background()
	dir := testmodel.Dir(t, "tiny", 1, 1)
	m, err := model.Load(dir, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want, err := m.Generate(ctx, []int32{5, 17, 200, 9, 44}, 6)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, id := range want {
		parts = append(parts, strconv.Itoa(int(id)))
	}
	wantLine := strings.Join(parts, ",")
	for _, l := range [][2]string{{"1", "1"}, {"1", "2"}, {"2", "2"}} {
		out := captureStdout(t, func() error {
			return commands["generate"].run(ctx, []string{"--model", dir, "--ids", "5,17,200,9,44", "-n", "6", "--threads", "1",
				"--pipeline", l[0], "--tensor", l[1]})
		})
		if got := strings.TrimSpace(out); got != wantLine {
			t.Fatalf("generate --pipeline %s --tensor %s printed %q, one rank %q", l[0], l[1], got, wantLine)
		}
	}
}

// TestDecodeGroupLayouts: decodegroup --pipeline P --tensor T --json runs
// the decode pipeline against one rank and prints one object per run with
// the step split, the collective's share non-zero only on the split
// stages; with --processes the ranks are decode-worker processes. (The
// tiny model's steps take a millisecond: the measured window must outlast
// the head's answers to the bench's polls, which a rank on one core busy
// with steps gives late.)
func TestDecodeGroupLayouts(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 1)
	ctx := context.Background()
	cases := []struct {
		name string
		args []string
	}{
		{"in-process", []string{"--pipeline", "1", "--tensor", "2", "--tokens", "32"}},
		{"rdma-fake", []string{"--pipeline", "2", "--tensor", "2", "--tokens", "32", "--transport", "rdma-fake"}},
		{"processes", []string{"--pipeline", "1", "--tensor", "2", "--tokens", "200", "--processes"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "rdma-fake" && testing.Short() && os.Getenv("KVTRANSFER_TRANSPORT") != "rdma-fake" {
				t.Skip("-short: the fake verbs wire runs with KVTRANSFER_TRANSPORT=rdma-fake (as decode-worker/collective's TestChannels)")
			}
			out := captureStdout(t, func() error {
				args := append([]string{"--model", dir, "--seqs", "1,2", "--json"}, tc.args...)
				return commands["decodegroup"].run(ctx, args)
			})
			checkLayoutRuns(t, out, tc.args[1], tc.args[3])
		})
	}
}

// checkLayoutRuns checks decodegroup --json's lines: 1 x 1 then P x T, at
// 1 and 2 sequences each.
func checkLayoutRuns(t *testing.T, out, P, T string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("want 4 JSON lines, got:\n%s", out)
	}
	for i, line := range lines {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %d: %v: %s", i, err, line)
		}
		for _, k := range []string{"pipeline", "tensor", "sequences", "tok_s", "ms_per_step", "compute_ms_per_step",
			"collective_ms_per_step", "queued_ms_per_step", "ratio_vs_1x1"} {
			if _, ok := r[k]; !ok {
				t.Fatalf("line %d has no %s: %s", i, k, line)
			}
		}
		wantP, wantT := "1", "1"
		if i >= 2 {
			wantP, wantT = P, T
		}
		if got := []any{r["pipeline"], r["tensor"], r["sequences"]}; got[0] != mustFloat(wantP) || got[1] != mustFloat(wantT) || got[2] != float64(1+i%2) {
			t.Fatalf("line %d: pipeline, tensor, sequences %v, want %s, %s, %d", i, got, wantP, wantT, 1+i%2)
		}
		split := i >= 2 && wantT != "1"
		if r["tok_s"].(float64) <= 0 || r["ms_per_step"].(float64) <= 0 || r["compute_ms_per_step"].(float64) <= 0 ||
			(r["collective_ms_per_step"].(float64) > 0) != split || (r["reductions_per_step"].(float64) > 0) != split {
			t.Fatalf("line %d: %s", i, line)
		}
	}
}

func mustFloat(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

// TestDecodeGroupLayoutFlags: flags the layout bench cannot run say why.
func TestDecodeGroupLayoutFlags(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 1)
	ctx := context.Background()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tensor", "7"}, "--tensor 7"},
		{[]string{"--tensor", "2", "--processes", "--transport", "rdma-fake"}, "leave out --processes"},
		{[]string{"--tensor", "2", "--transport", "udp"}, `--transport "udp"`},
		{[]string{"--tensor", "0"}, "--tensor 0"},
		{[]string{"--tensor", "2", "--pipeline", "99"}, "--pipeline 99"},
		{[]string{"--tensor", "2", "--forced-acceptance", "0.5"}, "leave them out with --tensor"},
		{[]string{"--processes", "--ranks", "2"}, "leave them out with --tensor"},
	} {
		err := commands["decodegroup"].run(ctx, append([]string{"--model", dir}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("decodegroup %v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}
