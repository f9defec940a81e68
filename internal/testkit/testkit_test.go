package testkit

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// childEnv makes the test binary print what a child process sees.
const childEnv = "TESTKIT_CHILD"

type seen struct{ Home, Config, Cache, GOCACHE string }

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		var s seen
		s.Home, _ = os.UserHomeDir()
		s.Config, _ = os.UserConfigDir()
		s.Cache, _ = os.UserCacheDir()
		if out, err := exec.Command("go", "env", "GOCACHE").Output(); err == nil {
			s.GOCACHE = strings.TrimSpace(string(out))
		}
		_ = json.NewEncoder(os.Stdout).Encode(s)
		os.Exit(0)
	}
	Main(m)
}

// goEnv is go env name in the environment env.
func goEnv(t *testing.T, env []string, name string) string {
	t.Helper()
	cmd := exec.Command("go", "env", name)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// userEnv is this process's environment as it was before Isolate.
func userEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := original[k]; !ok {
			env = append(env, kv)
		}
	}
	for k, v := range original {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// A child process finds its home, config and cache directories in the
// test's own home, not the user's, and the go command's build cache where
// the user's go command has it.
func TestChildSeesTheTestsHome(t *testing.T) {
	home := os.Getenv("HOME")
	if home == "" || home == original["HOME"] {
		t.Fatalf("HOME is %q, the user's was %q", home, original["HOME"])
	}
	if !strings.HasPrefix(home, os.TempDir()) {
		t.Errorf("HOME %q is not in the temporary directory %q", home, os.TempDir())
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	var s seen
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("child said %q: %v", out, err)
	}
	for what, dir := range map[string]string{"home": s.Home, "config": s.Config, "cache": s.Cache} {
		if dir != home && !strings.HasPrefix(dir, home+string(filepath.Separator)) {
			t.Errorf("the child's %s directory is %q, outside the test's home %q", what, dir, home)
		}
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to compare GOCACHE with")
	}
	if want := goEnv(t, userEnv(), "GOCACHE"); s.GOCACHE != want {
		t.Errorf("the child's GOCACHE is %q, the user's %q", s.GOCACHE, want)
	}
	if got, want := goEnv(t, os.Environ(), "GOMODCACHE"), goEnv(t, userEnv(), "GOMODCACHE"); got != want {
		t.Errorf("GOMODCACHE is %q, the user's %q", got, want)
	}
}

func TestPrompt(t *testing.T) {
	a, b := Prompt(64, 256, 1), Prompt(64, 256, 2)
	if len(a) != 64 || a[0] == b[0] {
		t.Fatalf("prompts of seeds 1 and 2: %v, %v", a[:4], b[:4])
	}
	for _, id := range a {
		if id < 0 || id >= 256 {
			t.Fatalf("id %d outside the vocabulary", id)
		}
	}
	if c := Prompt(64, 256, 1); c[63] != a[63] {
		t.Fatal("the same arguments gave another prompt")
	}
}

// WaitFor returns once the condition holds.
func TestWaitFor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan struct{})
	go close(done)
	WaitFor(ctx, t, "the goroutine", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
}
