package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/model"
)

// TestSparsePassOnly: mkmodel --sparse writes the released file set (the
// text shards, the model-level shard, the vision tower's two) with zero
// weights in holes, and stream --pass-only prefills two prompts through
// every layer of it: every layer's state has its config's sizes and only
// finite values (zero weights must not make a NaN anywhere), and the pass
// reads every layer's bytes.
func TestSparsePassOnly(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1)) // stream sets the budget as the limit
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := commands["mkmodel"].run(ctx, []string{"--preset", "tiny", "--sparse", "--out", dir}); err != nil {
		t.Fatal(err)
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "model-*-of-000012.safetensors"))
	if len(shards) != 12 {
		t.Fatalf("%d shards named of 12, want 9 layers, the model-level shard and the vision tower's two", len(shards))
	}
	out := captureStdout(t, func() error {
		return commands["stream"].run(ctx, []string{"--model", dir, "--pass-only", "--prompts", "2", "--prompt-len", "70", "--mem-budget", "256MiB", "--threads", "1"})
	})
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var rep passOnlyReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("last line of stdout %q: %v", lines[len(lines)-1], err)
	}
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	kda := cfg.KDAHeads*cfg.KDAHeadDim*cfg.KDAHeadDim*4 + 3*cfg.KDAProjDim()*(cfg.ConvKernel-1)*4
	mla := 69 * cfg.LatentWidth() * 2
	if rep.Layers != 9 || rep.LayersChecked != 18 || !rep.StatesFiniteShaped || rep.LayerStateBytes["kda"] != kda || rep.LayerStateBytes["mla"] != mla {
		t.Fatalf("report %+v: want 18 layer states checked, %d bytes per KDA layer, %d per MLA layer", rep, kda, mla)
	}
	if rep.Passes != 1 || rep.PassBytes < rep.WeightsBytes || !rep.WithinBudget || rep.PeakRSSBytes <= 0 {
		t.Fatalf("report %+v: want one pass reading all %d bytes of weights within the budget", rep, rep.WeightsBytes)
	}
}

// captureStdout runs f with os.Stdout going to a pipe and returns what it
// printed.
func captureStdout(t *testing.T, f func() error) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		var b bytes.Buffer
		io.Copy(&b, r)
		done <- b.Bytes()
	}()
	ferr := f()
	os.Stdout = old
	w.Close()
	out := <-done
	r.Close()
	if ferr != nil {
		t.Fatalf("%v\n%s", ferr, out)
	}
	return string(out)
}
