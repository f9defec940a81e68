package main

import (
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/kernels/cuda"
)

// TestValidateCPU runs bench validate's steps on the CPU reference at small
// sizes: conformance (one op case and the model checks), the limits and
// per-op figures, a streamed pass, and the Markdown, JSON and PNG report.
func TestValidateCPU(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	out := t.TempDir()
	captureStdout(t, func() error {
		return runValidate(context.Background(), []string{"--backend", "cpu", "--out", out, "--only", "matmul/F32", "--tokens", "16",
			"--copy-mib", "4", "--pass-tokens", "64", "--experts", "2", "--top-k", "1"})
	})
	var rep validateReport
	b, err := os.ReadFile(filepath.Join(out, "validate.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.ConformOK || rep.Conformance == nil || rep.Conformance.Agreement != 1 {
		t.Errorf("conformance on the CPU: %+v", rep.Conformance)
	}
	if rep.Limits.GEMMTFLOPs <= 0 || rep.Limits.HBMCopyGBps <= 0 || rep.Limits.H2DGBps <= 0 {
		t.Errorf("limits %+v", rep.Limits)
	}
	if len(rep.Ops) != 6 {
		t.Errorf("%d op figures, want 6", len(rep.Ops))
	}
	for _, o := range rep.Ops {
		if !(o.Rate > 0) || !(o.Ratio > 0) {
			t.Errorf("op %+v", o)
		}
	}
	if p := rep.Pass; p == nil || p.Layers != 9 || p.Tokens != 64 || !(p.PassS > 0) || !(p.Ratio > 0) {
		t.Errorf("pass %+v", rep.Pass)
	}
	md, err := os.ReadFile(filepath.Join(out, "validate.md"))
	if err != nil || !strings.Contains(string(md), "Streamed pass") || !strings.Contains(string(md), "matmul/F32") {
		t.Errorf("validate.md: %v\n%s", err, md)
	}
	f, err := os.Open(filepath.Join(out, "validate.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("validate.png: %v", err)
	}
}

// Without a usable GPU, validate --backend cuda fails at once, saying why.
func TestValidateNoGPU(t *testing.T) {
	t.Setenv(cuda.LibEnv, filepath.Join(t.TempDir(), "missing"))
	err := runValidate(context.Background(), []string{"--backend", "cuda", "--out", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("err = %v", err)
	}
}
