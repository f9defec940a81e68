// Package testbin builds tandem's binaries for tests that run them as real
// processes.
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Build builds the main packages pkgs (paths from the module root, e.g.
// "./coordinator") with CGO_ENABLED=0 into a temporary directory and
// returns it; each binary is named after its folder (".exe" on Windows,
// see Path). It skips the test where there is no go command (a device
// machine runs prebuilt test binaries).
func Build(tb testing.TB, pkgs ...string) string {
	tb.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		tb.Skip("no go command to build the binaries (a device machine runs the prebuilt tests)")
	}
	mod, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(mod)) == "" || strings.TrimSpace(string(mod)) == os.DevNull {
		tb.Fatalf("go env GOMOD: %v (%q): not inside the module", err, mod)
	}
	dir := tb.TempDir()
	build := exec.Command(gobin, append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	build.Dir = filepath.Dir(strings.TrimSpace(string(mod)))
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("go build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	return dir
}

// Path is the binary name built by Build in dir.
func Path(dir, name string) string {
	if runtime.GOOS == "windows" {
		name += ".exe"
	}
	return filepath.Join(dir, name)
}
