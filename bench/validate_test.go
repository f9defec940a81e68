package main

import (
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"runtime"
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
		return commands["validate"].run(context.Background(), []string{"--backend", "cpu", "--out", out, "--only", "matmul/F32", "--tokens", "16",
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
	checkValidateReport(t, out, "Streamed pass", "matmul/F32")
}

// Without a usable GPU, validate --backend cuda fails at once, saying why.
func TestValidateNoGPU(t *testing.T) {
	t.Setenv(cuda.LibEnv, filepath.Join(t.TempDir(), "missing"))
	err := commands["validate"].run(context.Background(), []string{"--backend", "cuda", "--out", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("err = %v", err)
	}
}

// TestValidateDecodeCPU runs the decode figures' steps on the CPU reference
// with the tiny model: conformance with MLA's absorbed form, decode steps
// at batch 1 and 16 against the bandwidth ceiling, local prefill, greedy
// ids, and the report.
func TestValidateDecodeCPU(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	out := t.TempDir()
	captureStdout(t, func() error {
		return commands["validate"].run(context.Background(), []string{"--backend", "cpu", "--decode", "--out", out, "--only", "mla_attention/absorbed",
			"--copy-mib", "4", "--pass-tokens", "32", "--greedy-tokens", "3"})
	})
	var rep validateReport
	b, err := os.ReadFile(filepath.Join(out, "validate.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.ConformOK || len(rep.Conformance.Results) == 0 || rep.Conformance.Results[0].Name != "mla_attention/absorbed" {
		t.Errorf("conformance: %+v", rep.Conformance)
	}
	d := rep.Decode
	if d == nil || d.Layers != 9 || !(d.StepBytes > 0) || d.StepBytes >= d.ResidentBytes || !(d.CopyGBps > 0) || !(d.Step1S > 0) || !(d.Step16S > 0) ||
		!(d.Ratio1 > 0) || !(d.Speedup16 > 0) || !(d.PrefillTokS > 0) || d.PrefillTokens != 32 {
		t.Fatalf("decode figures %+v", d)
	}
	// The CPU against itself: every greedy id equal.
	if d.GreedyPrompts != 4 || d.GreedyEqual != 4 || d.GreedyTokens != 3 {
		t.Errorf("greedy: %d of %d prompts equal over %d tokens", d.GreedyEqual, d.GreedyPrompts, d.GreedyTokens)
	}
	if len(rep.Ops) != 0 || rep.Pass != nil {
		t.Errorf("prefill figures in a decode run: %d ops, pass %+v", len(rep.Ops), rep.Pass)
	}
	checkValidateReport(t, out, "Decode rank", "of the ceiling")
}

// Off macOS, validate --backend metal fails at once, saying why.
func TestValidateNoMetal(t *testing.T) {
	if runtime.GOOS == "darwin" {
		t.Skip("macOS may have Metal")
	}
	err := commands["validate"].run(context.Background(), []string{"--backend", "metal", "--out", t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "Metal is only available on macOS on Apple Silicon") {
		t.Fatalf("err = %v", err)
	}
}

// checkValidateReport checks the files validate writes next to its JSON:
// validate.md holding each of the phrases, and a validate.png that decodes.
func checkValidateReport(t *testing.T, out string, phrases ...string) {
	t.Helper()
	md, err := os.ReadFile(filepath.Join(out, "validate.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range phrases {
		if !strings.Contains(string(md), p) {
			t.Errorf("validate.md lacks %q:\n%s", p, md)
		}
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

// TestValidateConfig: the backend's defaults fill the sizes not given, and
// validate names the flag at fault.
func TestValidateConfig(t *testing.T) {
	cpuDef, err := parseValidateFlags([]string{"--backend", "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if cpuDef.tokens != 32 || cpuDef.experts != 4 || cpuDef.topK != 2 || cpuDef.passTokens != 64 || cpuDef.copyMiB != 32 || cpuDef.budget != "512MiB" {
		t.Errorf("cpu defaults %+v", cpuDef)
	}
	metal, err := parseValidateFlags([]string{"--backend", "metal"})
	if err != nil {
		t.Fatal(err)
	}
	if !metal.decode || metal.passTokens != 512 || metal.copyMiB != 1024 {
		t.Errorf("metal defaults %+v", metal)
	}
	if _, err := parseValidateFlags([]string{"--backend", "cpu", "extra"}); err == nil {
		t.Error("a positional argument was accepted")
	}
	for _, tc := range []struct {
		name string
		edit func(*validateConfig)
		want string // "" for valid
	}{
		{"cpu defaults", func(*validateConfig) {}, ""},
		{"cuda", func(c *validateConfig) { c.backend = "cuda" }, ""},
		{"unknown backend", func(c *validateConfig) { c.backend = "tpu" }, "cuda, metal or cpu"},
		{"negative tokens", func(c *validateConfig) { c.tokens = -1 }, "--tokens"},
		{"negative experts", func(c *validateConfig) { c.experts = -4 }, "--experts"},
		{"top-k over experts", func(c *validateConfig) { c.topK = 5 }, "--top-k"},
		{"negative pass tokens", func(c *validateConfig) { c.passTokens = -1 }, "--pass-tokens"},
		{"negative copy size", func(c *validateConfig) { c.copyMiB = -1 }, "--copy-mib"},
		{"negative greedy tokens", func(c *validateConfig) { c.greedyTokens = -1 }, "--greedy-tokens"},
		{"budget not a size", func(c *validateConfig) { c.budget = "lots" }, "--memory-budget"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cpuDef
			tc.edit(&c)
			checkValidate(t, c.validate(), tc.want)
		})
	}
}
