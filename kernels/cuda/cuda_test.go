package cuda

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels/conformance"
	"github.com/tandem-inference/tandem/model/synth"
)

// Without the driver, Open fails at once with an error that names the
// library, where it looked, and what to do.
func TestOpenWithoutDriver(t *testing.T) {
	t.Setenv(LibEnv, filepath.Join(t.TempDir(), "no-driver-here"))
	b, err := Open(Options{})
	if err == nil {
		b.Close()
		t.Fatal("Open succeeded with no driver library")
	}
	if runtime.GOOS != "linux" {
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("err = %v, want ErrUnsupported", err)
		}
		return
	}
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("err = %v, want ErrNoDriver", err)
	}
	for _, want := range []string{"libcuda.so.1", "no-driver-here", LibEnv, "--backend cpu", "NVIDIA driver"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// CUDA_MEMCPY2D's field offsets on LP64 (cuda.h): the struct is passed by
// pointer, so Go's layout must be the C one.
func TestMemcpy2DLayout(t *testing.T) {
	want := map[string]uintptr{"srcX": 0, "srcY": 8, "srcType": 16, "srcHost": 24, "srcDevice": 32, "srcArray": 40, "srcPitch": 48,
		"dstX": 56, "dstY": 64, "dstType": 72, "dstHost": 80, "dstDevice": 88, "dstArray": 96, "dstPitch": 104, "widthBytes": 112, "heightLines": 120}
	ty := reflect.TypeOf(memcpy2D{})
	for i := 0; i < ty.NumField(); i++ {
		f := ty.Field(i)
		if off, ok := want[f.Name]; !ok || off != f.Offset {
			t.Errorf("field %s at %d, want %d", f.Name, f.Offset, off)
		}
	}
	if s := unsafe.Sizeof(memcpy2D{}); s != 128 {
		t.Errorf("size %d, want 128", s)
	}
}

// On a machine with an NVIDIA GPU: the conformance suite (the CI subset,
// or all of it with TANDEM_CONFORMANCE=full) on the device.
func TestConformance(t *testing.T) {
	b, err := Open(Options{})
	if err != nil {
		t.Skipf("no usable CUDA device: %v", err)
	}
	defer b.Close()
	t.Logf("device: %+v", b.Info())
	dir, err := synth.Ensure(context.Background(), synth.CacheDir(), "tiny", 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := conformance.Run(context.Background(), b, conformance.Options{Short: os.Getenv("TANDEM_CONFORMANCE") != "full", ModelDir: dir,
		Log: func(s string) { t.Log(s) }})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Failed() {
		t.Errorf("%s failed on %s: rel %.3g max %.3g (tol %.0e) %s", r.Name, b.Name(), r.Rel, r.Max, r.Tol, r.Note)
	}
	t.Logf("report:\n%s", rep.Markdown())
}
