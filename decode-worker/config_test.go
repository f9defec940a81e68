package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/model"
)

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadGroup(t *testing.T) {
	dir := t.TempDir()
	even := writeFile(t, dir, "even.yaml", `group: macs
secret: 0123456789abcdef0123
ranks:
  - endpoint: 10.0.0.1:7400
    memory_budget: 64GiB
  - endpoint: 10.0.0.2:7400
  - endpoint: 10.0.0.3:7400
`)
	l, secret, err := loadGroup(even, 17)
	if err != nil {
		t.Fatal(err)
	}
	if l.Group != "macs" || string(secret) != "0123456789abcdef0123" || len(l.Ranks) != 3 ||
		l.Ranks[0].Hi != 6 || l.Ranks[1].Lo != 6 || l.Ranks[2].Hi != 17 || l.Ranks[0].MemoryBudget != 64<<30 || l.Ranks[1].MemoryBudget != 0 {
		t.Fatalf("even layout: %+v", l)
	}
	writeFile(t, dir, "secret.txt", "from-a-file-0123456789\n")
	listed := writeFile(t, dir, "listed.yaml", `group: g
secret_file: secret.txt
ranks:
  - {endpoint: "a:1", layers: [0, 2]}
  - {endpoint: "b:1", layers: [2, 9]}
`)
	l, secret, err = loadGroup(listed, 9)
	if err != nil {
		t.Fatal(err)
	}
	if string(secret) != "from-a-file-0123456789" || l.Ranks[0].Hi != 2 || l.Ranks[1].Lo != 2 {
		t.Fatalf("listed layout: %+v, secret %q", l, secret)
	}
	t.Setenv("TANDEM_GROUP_SECRET", "from-the-environment-123")
	if _, secret, _ = loadGroup(listed, 9); string(secret) != "from-the-environment-123" {
		t.Fatalf("secret from the environment: %q", secret)
	}
	t.Setenv("TANDEM_GROUP_SECRET", "")
	tensor := writeFile(t, dir, "tensor.yaml", `group: g
secret: 0123456789abcdef0123
tensor: 2
ranks: [{endpoint: "a:1"}, {endpoint: "b:1"}, {endpoint: "c:1"}, {endpoint: "d:1"}]
`)
	if l, _, err = loadGroup(tensor, 9); err != nil {
		t.Fatal(err)
	}
	if l.Stages() != 2 || l.Ranks[1].Lo != 0 || l.Ranks[1].Hi != 5 || l.Ranks[3].Lo != 5 {
		t.Fatalf("2 x 2 layout: %+v", l)
	}

	for name, tc := range map[string]struct{ text, want string }{
		"short secret": {"secret: short\nranks: [{endpoint: \"a:1\"}]\n", "at least 16"},
		"no ranks":     {"secret: 0123456789abcdef0123\n", "no ranks"},
		"partial":      {"secret: 0123456789abcdef0123\nranks: [{endpoint: \"a:1\", layers: [0, 4]}, {endpoint: \"b:1\"}]\n", "all or none"},
		"gap":          {"secret: 0123456789abcdef0123\nranks: [{endpoint: \"a:1\", layers: [0, 4]}, {endpoint: \"b:1\", layers: [5, 9]}]\n", "do not continue"},
		"short":        {"secret: 0123456789abcdef0123\nranks: [{endpoint: \"a:1\", layers: [0, 8]}]\n", "model has 9"},
		"bad budget":   {"secret: 0123456789abcdef0123\nranks: [{endpoint: \"a:1\", memory_budget: lots}]\n", "memory_budget"},
		"bad endpoint": {"secret: 0123456789abcdef0123\nranks: [{endpoint: \"nohost\"}]\n", "endpoint"},
		"too many":     {"secret: 0123456789abcdef0123\nranks: [{endpoint: \"a:1\"}, {endpoint: \"b:1\"}]\n", "cannot split"},
		"part stage":   {"secret: 0123456789abcdef0123\ntensor: 2\nranks: [{endpoint: \"a:1\"}, {endpoint: \"b:1\"}, {endpoint: \"c:1\"}]\n", "whole stages"},
		"stage layers": {"secret: 0123456789abcdef0123\ntensor: 2\nranks: [{endpoint: \"a:1\", layers: [0, 9]}, {endpoint: \"b:1\", layers: [0, 8]}]\n", "share its layers"},
	} {
		p := writeFile(t, dir, strings.ReplaceAll(name, " ", "_")+".yaml", tc.text)
		n := 9
		if name == "too many" {
			n = 1
		}
		if _, _, err := loadGroup(p, n); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
	if _, _, err := loadGroup(filepath.Join(dir, "missing.yaml"), 9); err == nil {
		t.Error("missing group file loaded")
	}
}

func TestLoadConfig(t *testing.T) {
	cfg, err := loadConfig([]string{"--group-config", "g.yaml", "--model", "m"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rank != 0 || cfg.MaxBatch != 64 || cfg.PrefillChunk != 512 || cfg.CacheDType != model.BF16 ||
		cfg.Idle != 3*time.Second || cfg.Heartbeat != 500*time.Millisecond || !cfg.Frontdoor || cfg.LogLevel != "info" || cfg.Backend != "cpu" ||
		!cfg.Draft || cfg.DraftMax != 4 {
		t.Fatalf("defaults: %+v", cfg)
	}
	// File < environment < flags.
	file := writeFile(t, t.TempDir(), "worker.yaml", "max_batch: 8\nprefill_chunk: 128\nmesh:\n  idle: 7s\nmemory_budget: 1GiB\nrank: 1\ndraft:\n  mode: off\n  max: 2\n")
	t.Setenv("TANDEM_DECODE_WORKER_PREFILL_CHUNK", "256")
	t.Setenv("TANDEM_DECODE_WORKER_MESH_HEARTBEAT", "250ms")
	cfg, err = loadConfig([]string{"--group-config", "g.yaml", "--model", "m", "--config", file, "--rank", "2", "--cache-dtype", "f32"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rank != 2 || cfg.MaxBatch != 8 || cfg.PrefillChunk != 256 || cfg.Idle != 7*time.Second ||
		cfg.Heartbeat != 250*time.Millisecond || cfg.MemoryBudget != 1<<30 || cfg.CacheDType != model.F32 || cfg.Draft || cfg.DraftMax != 2 {
		t.Fatalf("layered config: %+v", cfg)
	}
	for _, args := range [][]string{
		{"--model", "m"},
		{"--group-config", "g.yaml"},
		{"--group-config", "g.yaml", "--model", "m", "--rank", "-1"},
		{"--group-config", "g.yaml", "--model", "m", "--cache-dtype", "fp8"},
		{"--group-config", "g.yaml", "--model", "m", "--memory-budget", "-3"},
		{"--group-config", "g.yaml", "--model", "m", "--backend", "cuda"},
		{"--group-config", "g.yaml", "--model", "m", "--draft-mode", "eagle"},
		{"--group-config", "g.yaml", "--model", "m", "--draft-max", "0"},
		{"--group-config", "g.yaml", "--model", "m", "--draft-max", "17"},
		{"--group-config", "g.yaml", "--model", "m", "--config", "/nonexistent/w.yaml"},
		{"--no-such-flag"},
	} {
		if _, err := loadConfig(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestStrictFiles: the group file and the worker's config file refuse an
// unknown key, naming it, the file and the nearest valid key.
func TestStrictFiles(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ text, want string }{
		"top":      {"secret: 0123456789abcdef0123\nsecert_file: s\nranks: [{endpoint: \"a:1\"}]\n", `unknown key "secert_file" (did you mean secret_file?)`},
		"rank":     {"secret: 0123456789abcdef0123\nranks:\n  - endpoint: a:1\n  - endpoint: b:1\n    memory_budgt: 8GiB\n", `ranks[1]: unknown key "memory_budgt" (did you mean memory_budget?)`},
		"far":      {"secret: 0123456789abcdef0123\nranks: [{endpoint: \"a:1\", colour: blue}]\n", `ranks[0]: unknown key "colour" (valid keys: endpoint, layers, memory_budget)`},
		"not map":  {"secret: 0123456789abcdef0123\nranks: [a:1]\n", "ranks[0] is not a map"},
		"bad size": {"secret: 0123456789abcdef0123\nranks: [{endpoint: \"a:1\", memory_budget: 8G}]\n", "KiB MiB GiB TiB"},
	} {
		p := writeFile(t, dir, strings.ReplaceAll(name, " ", "_")+".yaml", tc.text)
		if _, _, err := loadGroup(p, 9); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("group file %s: %v, want the file and %q", name, err, tc.want)
		}
	}
	worker := writeFile(t, dir, "worker.yaml", "max_bach: 8\n")
	if _, err := loadConfig([]string{"--group-config", "g.yaml", "--model", "m", "--config", worker}); err == nil ||
		!strings.Contains(err.Error(), `unknown key "max_bach" (did you mean max_batch?)`) || !strings.Contains(err.Error(), worker) {
		t.Errorf("worker config file: %v", err)
	}
	for _, args := range [][]string{{"--memory-budget", "2G"}, {"--rdma-slot-size", "lots"}} {
		if _, err := loadConfig(append([]string{"--group-config", "g.yaml", "--model", "m"}, args...)); err == nil || !strings.Contains(err.Error(), "KiB MiB GiB TiB") {
			t.Errorf("%v: %v, want the grammar", args, err)
		}
	}
	cfg, err := loadConfig([]string{"--group-config", "g.yaml", "--model", "m", "--rdma-slot-size", "64KiB", "--memory-budget", "1.5gib"})
	if err != nil || cfg.RDMA.SlotSize != 64<<10 || cfg.MemoryBudget != 3<<29 {
		t.Errorf("byte sizes: %v", err)
	}
}
