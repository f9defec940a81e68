package vision

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/tandem-inference/tandem/kernels/cpu"
)

// The tower must give the same bits on amd64 and arm64: the features become
// part of a prompt's state, which one architecture prefills and the other
// decodes, and the prefill worker and the decode group's first rank must
// agree on an image. TestCrossArchFeatures runs crossArchFeatures natively
// and in this package's tests built for arm64 under qemu-user.

const (
	crossArchDirEnv = "TANDEM_VISION_CROSSARCH_MODEL"
	crossArchOutEnv = "TANDEM_VISION_CROSSARCH_OUT"
)

// crossArchFeatures runs two images (one resampled table, one at the
// table's size) through the tower in dir and returns the features' bytes.
func crossArchFeatures(dir string) ([]byte, error) {
	tw, err := Load(context.Background(), cpu.New(2), dir)
	if err != nil {
		return nil, err
	}
	defer tw.Close()
	c := tw.Config()
	feats, err := tw.Features(context.Background(), []Patches{randomPatches(c, 10, 4, 1), randomPatches(c, c.PosH, c.PosW, 2)})
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, f := range feats {
		for _, v := range f {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
		}
	}
	return out, nil
}

// TestCrossArchHelper is the arm64 side of TestCrossArchFeatures.
func TestCrossArchHelper(t *testing.T) {
	dir, outFile := os.Getenv(crossArchDirEnv), os.Getenv(crossArchOutEnv)
	if dir == "" || outFile == "" {
		t.Skip("started by TestCrossArchFeatures only")
	}
	b, err := crossArchFeatures(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(outFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCrossArchFeatures: the features of a random tower are byte-identical
// between this amd64 run and an arm64 run under qemu-user.
func TestCrossArchFeatures(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs this package's tests for arm64")
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("the native side of this comparison is amd64")
	}
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil {
		t.Skip("qemu-aarch64-static is not installed (scripts/setup.sh installs Debian's qemu-user-static): the arm64 comparison is skipped")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	c := testConfig()
	dir := t.TempDir()
	writeCheckpoint(t, dir, visionJSON(c), randomTensors(c, 4))
	bin := filepath.Join(t.TempDir(), "vision.arm64.test")
	build := exec.Command(gobin, "test", "-c", "-o", bin, ".")
	build.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building this package's tests for arm64: %v\n%s", err, out)
	}
	outFile := filepath.Join(t.TempDir(), "arm64.bin")
	run := exec.Command(qemu, bin, "-test.run=^TestCrossArchHelper$", "-test.count=1")
	run.Env = append(os.Environ(), crossArchDirEnv+"="+dir, crossArchOutEnv+"="+outFile)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("the arm64 run under qemu: %v\n%s", err, out)
	}
	arm, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	native, err := crossArchFeatures(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(native) == 0 || !bytes.Equal(native, arm) {
		t.Fatalf("amd64 and arm64 features differ (%d and %d bytes)", len(native), len(arm))
	}
}
