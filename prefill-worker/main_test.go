package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kernels/cuda"
	"github.com/tandem-inference/tandem/model"
)

func ids(n, seed int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", (i*7919+seed*104729+13)%256)
	}
	return b.String()
}

// TestStandalone runs the binary's main path in-process on the tiny preset:
// three prompts share a pass, each state file equals the model core's
// prefill of prompt[:-1], and the report names passes and peak RSS.
func TestStandalone(t *testing.T) {
	t.Setenv("TANDEM_PREFILL_WORKER_MEMORY_LIMIT", "false") // keep the test process's GC as it is
	dir := testmodel.Dir(t, "tiny", 1, 2)
	out := t.TempDir()
	prompts := []string{ids(40, 1), ids(1, 2), ids(90, 3)}
	args := []string{"--model", dir, "--memory-budget", "64MiB", "--depth", "1", "--out", out, "--log-format", "json", "--log-level", "warn"}
	for _, p := range prompts {
		args = append(args, "--prompt", p)
	}
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	t.Log(stdout.String())
	if !strings.Contains(stdout.String(), "1 passes, 3 jobs done, 0 failed") {
		t.Fatalf("report: %s", stdout.String())
	}
	m, err := model.Load(dir, cpu.New(2), model.LoadOptions{Embed: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i, p := range prompts {
		toks, _ := parseIDs(p)
		s := m.NewState(0, m.Cfg.NumLayers)
		if len(toks) > 1 {
			if err := m.PrefillState(context.Background(), []*model.SeqState{s}, [][]int32{toks[:len(toks)-1]}); err != nil {
				t.Fatal(err)
			}
		}
		want, _ := s.MarshalBinary()
		got, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("p%d.k3st", i)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("prompt %d: state file differs from the model core's prefill (%v)", i, err)
		}
	}
}

// TestDryRun plans a long and a short prompt under a budget that forces
// super-chunks, from a prompts file, without reading weights.
func TestDryRun(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	f := filepath.Join(t.TempDir(), "prompts.txt")
	os.WriteFile(f, []byte(ids(3000, 1)+"\n\n"+ids(50, 2)+"\n"), 0o644)
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"--model", dir, "--memory-budget", "6MiB", "--prompts-file", f, "--dry-run"}, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	s := stdout.String()
	t.Log(s)
	for _, want := range []string{"9 layers", "pass 1: depth", "super-chunk", "p1 [0,49) final", "p0 [", ",2999) final"} {
		if !strings.Contains(s, want) {
			t.Errorf("dry run output lacks %q", want)
		}
	}
}

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "prefill.yaml")
	os.WriteFile(cfgFile, []byte("model: /models/k3\nsink:\n  queue: 9\n  timeout: 3s\nread_size: 16MiB\n"), 0o644)
	t.Setenv("TANDEM_PREFILL_WORKER_MEMORY_BUDGET", "3GiB")
	c, err := loadConfig([]string{"--config", cfgFile, "--prompt", "1,2, 3", "--out", dir, "--depth", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Model != "/models/k3" || c.SinkQueue != 9 || c.SinkTimeout.Seconds() != 3 || c.ReadSize != 16<<20 ||
		c.Budget != 3<<30 || c.Depth != 2 || len(c.Prompts) != 1 || len(c.Prompts[0]) != 3 || c.CacheDType != model.BF16 {
		t.Fatalf("config %+v", c)
	}
	badFile := filepath.Join(dir, "typo.yaml")
	os.WriteFile(badFile, []byte("memory_budgt: 2GiB\n"), 0o644)
	oldFile := filepath.Join(dir, "old.yaml")
	os.WriteFile(oldFile, []byte("mem_budget: 2GiB\n"), 0o644)
	// The old flag spelling still works, and says the new one.
	if c, err := loadConfig([]string{"--model", "m", "--mem-budget", "2GiB"}); err != nil || c.Budget != 2<<30 {
		t.Errorf("--mem-budget: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--model is required"},
		{[]string{"--model", "m", "--memory-budget", "lots"}, "memory_budget (--memory-budget): \"lots\" is not a byte size, which is a number"},
		{[]string{"--model", "m", "--memory-budget", "2G"}, "KiB MiB GiB TiB"},
		{[]string{"--model", "m", "--config", badFile}, `unknown key "memory_budgt" (did you mean memory_budget?)`},
		{[]string{"--model", "m", "--config", oldFile}, `key "mem_budget" was renamed "memory_budget"`},
		{[]string{"--model", "m", "--prompt", "1,x"}, "prompt 1"},
		{[]string{"--model", "m", "--prompt", "1,2"}, "--out is required"},
		{[]string{"--model", "m", "--backend", "tpu"}, "want cpu, cuda or auto"},
		{[]string{"--model", "m", "--cache-dtype", "fp8"}, "cache_dtype"},
		{[]string{"--model", "m", "--io", "mmap"}, "I/O mode"},
		{[]string{"--model", "m", "stray"}, "unexpected arguments"},
	} {
		t.Setenv("TANDEM_PREFILL_WORKER_MEMORY_BUDGET", "")
		if _, err := loadConfig(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.args, err, tc.want)
		}
	}
	if err := run(context.Background(), []string{"--model", "nowhere"}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "no prompts") {
		t.Errorf("no prompts: %v", err)
	}
}

// TestCUDABackendWithoutDriver: `prefill-worker --backend cuda` where the
// driver cannot be loaded exits non-zero at once, naming the missing
// library and what to do; `--backend auto` computes on the CPU and says why.
// TANDEM_CUDA_LIB points at a file that does not exist, so the check holds
// on a GPU machine too.
func TestCUDABackendWithoutDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Setenv("TANDEM_PREFILL_WORKER_MEMORY_LIMIT", "false")
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	t.Setenv(cuda.LibEnv, missing)
	dir := testmodel.Dir(t, "tiny", 1, 2)
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the binary (a device machine runs the prebuilt tests)")
	}
	bin := filepath.Join(t.TempDir(), "prefill-worker")
	build := exec.Command(gobin, "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--model", dir, "--backend", "cuda", "--prompt", "1,2,3", "--out", t.TempDir())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	t.Logf("exit %v after %v:\n%s", err, time.Since(start).Round(time.Millisecond), out.String())
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("want a non-zero exit, got %v", err)
	}
	for _, want := range []string{"--backend cuda", "libcuda.so.1", missing, "--backend cpu", "NVIDIA driver"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output does not mention %q", want)
		}
	}
	if strings.Contains(out.String(), "panic") {
		t.Error("the binary panicked")
	}

	// auto falls back to the CPU, logged, and prefills.
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"--model", dir, "--backend", "auto", "--prompt", "1,2,3", "--out", t.TempDir(), "--log-format", "json"}, &stdout, &stderr); err != nil {
		t.Fatalf("--backend auto: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "CUDA is not usable") || !strings.Contains(stderr.String(), "libcuda.so.1") {
		t.Errorf("--backend auto did not log why it uses the CPU:\n%s", stderr.String())
	}
	if !strings.Contains(stdout.String(), "1 jobs done, 0 failed") {
		t.Errorf("--backend auto report: %s", stdout.String())
	}
}
