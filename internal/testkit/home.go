package testkit

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// homeVars are the variables that locate a user's home, config, cache and
// data directories; Isolate points each into the temporary home.
func homeVars(home string) map[string]string {
	if runtime.GOOS == "windows" {
		return map[string]string{
			"HOME":         home,
			"USERPROFILE":  home,
			"APPDATA":      filepath.Join(home, "AppData", "Roaming"),
			"LOCALAPPDATA": filepath.Join(home, "AppData", "Local"),
		}
	}
	return map[string]string{
		"HOME":            home,
		"XDG_CONFIG_HOME": filepath.Join(home, ".config"),
		"XDG_CACHE_HOME":  filepath.Join(home, ".cache"),
		"XDG_DATA_HOME":   filepath.Join(home, ".local", "share"),
		"XDG_STATE_HOME":  filepath.Join(home, ".local", "state"),
	}
}

// pinned are the variables whose values (given or derived from the user's
// home) Isolate keeps: the go command's build and module caches and its
// settings file, so that go build in a test neither rebuilds nor downloads
// everything into the temporary home, and CUDA's kernel cache. The shared
// test-model cache, TANDEM_TEST_CACHE, defaults to a folder under the
// temporary directory, which Isolate does not change.
var pinned = []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOENV"}

// original holds the variables that Isolate changed, as they were ("" for
// unset); the tests of this package compare with it.
var original = map[string]string{}

// Main runs m's tests in a home of their own (Isolate) and exits with
// their code; call it from TestMain in every package whose tests start
// processes or read the user's config or cache directories (credentials,
// the NATS data directory, the demo's models):
//
//	func TestMain(m *testing.M) { testkit.Main(m) }
//
// With goleak, wrap m instead: goleak.VerifyTestMain(testkit.Isolated(m)).
func Main(m *testing.M) { os.Exit(Isolated(m).Run()) }

// Isolated is m, whose Run runs the tests in a home of their own (Isolate)
// and removes it afterwards.
func Isolated(m *testing.M) interface{ Run() int } { return isolated{m} }

type isolated struct{ m *testing.M }

func (i isolated) Run() int {
	cleanup, err := Isolate()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testkit: %v\n", err)
		return 2
	}
	defer cleanup()
	return i.m.Run()
}

// Isolate gives this process, and every process it starts from then on, a
// new empty home: HOME and the XDG directories (USERPROFILE, APPDATA and
// LOCALAPPDATA on Windows) point into a temporary folder, so that nothing
// the user's tandem, NATS or anything else left in their home is read, and
// nothing is written there. The go command's caches, GOPATH and settings
// file keep their current places (fixed first in the environment). The
// returned function removes the temporary home; Isolate is meant for
// TestMain, before any test runs.
func Isolate() (cleanup func(), err error) {
	if err := pin(); err != nil {
		return nil, err
	}
	home, err := os.MkdirTemp("", "tandem-test-home-")
	if err != nil {
		return nil, err
	}
	for k, v := range homeVars(home) {
		if _, ok := original[k]; !ok {
			original[k] = os.Getenv(k)
		}
		if err := os.MkdirAll(v, 0o700); err != nil {
			return nil, err
		}
		os.Setenv(k, v)
	}
	return func() { removeAll(home) }, nil
}

// pin sets the pinned variables to their current values.
func pin() error {
	vals := map[string]string{}
	if gobin, err := exec.LookPath("go"); err == nil {
		out, err := exec.Command(gobin, append([]string{"env", "-json"}, pinned...)...).Output()
		if err != nil {
			return fmt.Errorf("go env: %w", err)
		}
		if err := json.Unmarshal(out, &vals); err != nil {
			return fmt.Errorf("go env: %w", err)
		}
	} // else there is no go command to run, and nothing to keep for it
	if home := os.Getenv("HOME"); runtime.GOOS == "linux" && home != "" {
		vals["CUDA_CACHE_PATH"] = filepath.Join(home, ".nv", "ComputeCache")
	}
	for k, v := range vals {
		if os.Getenv(k) == "" && v != "" {
			os.Setenv(k, v)
		}
	}
	return nil
}

// removeAll removes dir, making read-only folders in it (a module cache's)
// writable first if it has to.
func removeAll(dir string) {
	if os.RemoveAll(dir) == nil {
		return
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}
