package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
)

// TestBackendMetalElsewhere: off Apple Silicon, the decode-worker binary
// asked for Metal exits non-zero at once, saying why, before it reads the
// model.
func TestBackendMetalElsewhere(t *testing.T) {
	if runtime.GOOS == "darwin" && runtime.GOARCH == "arm64" {
		t.Skip("Apple Silicon has Metal")
	}
	ctx := testctx.Context(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "decode-worker")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	group := filepath.Join(dir, "group.yaml")
	if err := os.WriteFile(group, []byte("group: g\nsecret: "+groupSecret+"\nranks:\n  - endpoint: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := exec.CommandContext(ctx, bin, "--backend", "metal", "--group-config", group, "--model", filepath.Join(dir, "no-model")).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v (want status 1)\n%s", err, out)
	}
	msg := string(out)
	if !strings.Contains(msg, "--backend metal: metal: Metal is only available on macOS on Apple Silicon") {
		t.Fatalf("message: %s", msg)
	}
	if strings.Contains(msg, "no-model") {
		t.Fatalf("it reached the model before refusing the backend: %s", msg)
	}
	t.Logf("refused in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(msg))
}

// TestResidentBytes: a rank holds its layers' tensors, the embedding and
// the vision tower on rank 0 and the other model-level tensors on the last
// rank, so the ranks
// together hold the whole checkpoint once.
func TestResidentBytes(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := rank.Even("g", cfg.NumLayers, []string{"a:1", "b:1"})
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for r := range l.Ranks {
		n := residentBytes(ck, cfg, l, r)
		if n <= 0 {
			t.Errorf("rank %d: %d bytes", r, n)
		}
		sum += n
	}
	var text int64
	for _, name := range ck.Names() {
		if strings.HasPrefix(name, "language_model.") || isVision(name) {
			ti, _ := ck.Tensor(name)
			text += ti.Size
		}
	}
	if sum != text {
		t.Errorf("the ranks hold %d bytes together, the checkpoint's text model and vision tower %d", sum, text)
	}
}

// TestResidentBytesTensor: the two tensor ranks of a 1 x 2 group each hold
// less than one rank holding everything, and together at least all of it
// (the replicated tensors twice).
func TestResidentBytesTensor(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	one, err := rank.Even("g", cfg.NumLayers, []string{"a:1"})
	if err != nil {
		t.Fatal(err)
	}
	two, err := rank.EvenTensor("g", cfg.NumLayers, []string{"a:1", "b:1"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	whole := residentBytes(ck, cfg, one, 0)
	a, b := residentBytes(ck, cfg, two, 0), residentBytes(ck, cfg, two, 1)
	if a >= whole || b >= whole || a+b < whole {
		t.Fatalf("tensor ranks hold %d and %d bytes; one rank holds %d", a, b, whole)
	}
	t.Logf("one rank %d bytes; tensor ranks %d and %d", whole, a, b)
}

func TestCheckFits(t *testing.T) {
	if err := checkFits(10<<30, 96<<30, 1, 10, 20); err != nil {
		t.Errorf("fits: %v", err)
	}
	if err := checkFits(10<<30, 0, 1, 10, 20); err != nil {
		t.Errorf("unknown working set: %v", err)
	}
	err := checkFits(100<<30, 96<<30, 1, 10, 20)
	if err == nil || !strings.Contains(err.Error(), "rank 1's layers [10, 20) hold 100.0 GiB of weights, more than the GPU's working set of 96.0 GiB") {
		t.Errorf("too big: %v", err)
	}
}
