package modelconfig_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testbin"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// addressLimitKiB is the address space each process may use: a hostile
// config.json must be refused within it (a billion layers once drove the
// workers to 24 GB and the OOM killer).
const addressLimitKiB = 1 << 20 // 1 GiB

// TestHostileConfigUnderAnAddressSpaceLimit runs the real binaries (bench
// logits, prefill-worker with and without --dry-run, decode-worker and the
// coordinator) under a 1 GiB address-space limit on a checkpoint whose
// config.json claims a billion layers: each refuses it naming the field.
// A config within the limits that claims more layers than the checkpoint
// holds is refused by every process that opens the checkpoint, before it
// sizes anything by it. The same binaries under the same limit run the
// real config (bench logits), so the limit itself is not what fails.
func TestHostileConfigUnderAnAddressSpaceLimit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("address-space limits are set with ulimit -v on Linux")
	}
	if testing.Short() {
		t.Skip("builds four binaries")
	}
	bin := testbin.Build(t, "./bench", "./prefill-worker", "./decode-worker", "./coordinator")
	good := testmodel.Dir(t, "tiny", 1, 2)

	// limited runs a binary under the limit and returns its output.
	//
	// A binary that links purego (decode-worker's verbs binding; GPU
	// backends) makes its threads with pthread_create (purego's fakecgo),
	// and each thread reserves address space the config has no say in: a
	// stack of RLIMIT_STACK (8 MiB by default) and, at its first malloc, a
	// 64 MiB glibc arena. A handful of threads exhausts 1 GiB and the
	// process dies with "fakecgo: pthread_create failed: 11" before it
	// reads the config. A 1 MiB stack limit and at most two arenas keep
	// those fixed costs small, so the limit still measures what the config
	// makes the process allocate.
	limited := func(t *testing.T, name string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command("/bin/sh", append([]string{"-c", `ulimit -v "$0" && ulimit -s 1024 && exec "$@"`, strconv.Itoa(addressLimitKiB), filepath.Join(bin, name)}, args...)...)
		cmd.Env = append(os.Environ(), "TANDEM_COORDINATOR_NATS_PASSWORD=x", "HOME="+t.TempDir(), "MALLOC_ARENA_MAX=2")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		t.Logf("%s %s: %v in %v", name, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond))
		return out.String(), err
	}

	// The control: the real config runs under the same limit.
	if out, err := limited(t, "bench", "logits", "--model", good, "--ids", "5,17,200", "--out", filepath.Join(t.TempDir(), "logits")); err != nil {
		t.Fatalf("bench logits on the real config under the limit: %v\n%s", err, out)
	}

	for _, c := range []struct {
		layers int
		want   string
	}{
		{1_000_000_000, "num_hidden_layers is 1000000000, want 1..1024"},
		{1000, "num_hidden_layers is 1000, but the checkpoint holds no tensor of layer 9"},
	} {
		dir := withLayers(t, good, c.layers)
		group := filepath.Join(t.TempDir(), "group.yaml")
		secret := filepath.Join(filepath.Dir(group), "group.secret")
		if err := os.WriteFile(secret, []byte("hostile-config-test-group-secret-0123456789"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(group, []byte("group: g\nsecret_file: group.secret\nranks:\n  - endpoint: 127.0.0.1:0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		runs := [][]string{
			{"bench", "logits", "--model", dir, "--ids", "5,17,200", "--out", filepath.Join(t.TempDir(), "logits")},
			{"prefill-worker", "--model", dir, "--memory-budget", "64MiB", "--prompt", "5,17,200", "--out", t.TempDir()},
			{"prefill-worker", "--model", dir, "--memory-budget", "64MiB", "--prompt", "5,17,200", "--dry-run"},
			{"decode-worker", "--model", dir, "--group-config", group, "--rank", "0", "--threads", "1"},
		}
		if c.layers > 1024 {
			// The coordinator reads config.json only (no checkpoint).
			runs = append(runs, []string{"coordinator", "serve", "--model", dir, "--log-level", "error"})
		}
		for _, r := range runs {
			out, err := limited(t, r[0], r[1:]...)
			if err == nil {
				t.Errorf("%s accepted %d layers:\n%s", r[0], c.layers, out)
				continue
			}
			if !strings.Contains(out, c.want) {
				t.Errorf("%s, %d layers: %v, want an error naming %q:\n%s", r[0], c.layers, err, c.want, out)
			}
		}
	}
}

// withLayers is the checkpoint in dir (linked, not copied) with
// num_hidden_layers set to n in its config.json.
func withLayers(t *testing.T, dir string, n int) string {
	t.Helper()
	out := t.TempDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "config.json" {
			continue
		}
		if err := os.Symlink(filepath.Join(dir, e.Name()), filepath.Join(out, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	text := cfg["text_config"].(map[string]any)
	text["num_hidden_layers"] = n
	// Without kda_layers, every layer not in full_attn_layers is KDA: the
	// lists stay valid for any count.
	delete(text["linear_attn_config"].(map[string]any), "kda_layers")
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCoordinatorRefusesAHugeLayerListAtOnce runs the coordinator on a
// config.json whose kda_layers holds two million entries (a hostile list
// once took over 10 minutes to refuse, 40,000 entries 25 s): it exits
// with an error naming the list well within a minute.
func TestCoordinatorRefusesAHugeLayerListAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the coordinator")
	}
	bin := testbin.Build(t, "./coordinator")
	dir := withLayers(t, testmodel.Dir(t, "tiny", 1, 2), 2)
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	huge := make([]int, 2_000_000)
	for i := range huge {
		huge[i] = 1
	}
	cfg["text_config"].(map[string]any)["linear_attn_config"].(map[string]any)["kda_layers"] = huge
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "coordinator"), "serve", "--model", dir, "--log-level", "error")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("refused in %v", time.Since(start).Round(time.Millisecond))
	if ctx.Err() != nil {
		t.Fatalf("the coordinator did not refuse the list within a minute:\n%.2000s", out)
	}
	if err == nil || !strings.Contains(string(out), "kda_layers lists 2000000 layers") {
		t.Fatalf("coordinator serve: %v, want an error naming kda_layers:\n%.2000s", err, out)
	}
}
