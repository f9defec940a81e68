package emu

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/kernels/internal/emuharness"
)

// The emulator driver is built at most once per test run in each variant
// (and reused across runs when TANDEM_TEST_CACHE names a cache directory):
// the correct kernels, and the kernels with their planted bugs.
var (
	buildOnce  sync.Once
	buildBins  [2]string // [correct, planted]
	buildErr   error
	cleanup    = func() {}
	driverTime = 3 * time.Minute // one driver run; a kernel whose barriers deadlock ends here
)

func TestMain(m *testing.M) {
	code := testkit.Isolated(m).Run()
	cleanup()
	os.Exit(code)
}

// spec is the driver's build: the CUDA sources, the emulator header and the
// driver, with the host's C++ compiler.
func spec() (emuharness.Spec, error) {
	cu, err := filepath.Glob("../src/*.cu*")
	if err != nil {
		return emuharness.Spec{}, err
	}
	if len(cu) == 0 {
		return emuharness.Spec{}, errors.New("no kernel sources in ../src")
	}
	return emuharness.Spec{
		Name:      "cuemu",
		Compilers: []string{"g++", "clang++", "clang++-19"},
		Flags: func(string) []string {
			return []string{"-std=c++20", "-O2", "-pthread", "-DCUEMU", "-Wall", "-Wextra", "-Werror"}
		},
		Main:     "driver/driver.cc",
		Sources:  append(cu, "cuemu.h", "driver/driver.cc", "../../internal/emuharness/driverio.h"),
		Variants: []emuharness.Variant{{Name: "correct"}, {Name: "planted", Flags: []string{"-DPLANTED_BUG"}}},
	}, nil
}

// drivers builds both variants and returns their paths; t is skipped when
// no compiler exists.
func drivers(t *testing.T) (correct, planted string) {
	t.Helper()
	buildOnce.Do(func() {
		sp, err := spec()
		if err != nil {
			buildErr = err
			return
		}
		var bins []string
		bins, cleanup, buildErr = emuharness.Build(sp)
		if buildErr == nil {
			buildBins = [2]string{bins[0], bins[1]}
		}
	})
	if errors.Is(buildErr, emuharness.ErrNoCXX) {
		t.Skip(buildErr)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBins[0], buildBins[1]
}

// call is one driver request: an op, its scalar parameters and its arrays.
type call struct {
	op     string
	params map[string]float64
	arrays map[string][]byte
}

// run sends c to the driver at bin and returns its output arrays.
func run(bin string, c call) (map[string][]byte, error) {
	return emuharness.Run(bin, emuharness.Call{Op: c.op, Params: c.params, Arrays: c.arrays}, nil, driverTime)
}

var (
	f32Bytes = emuharness.F32Bytes
	i32Bytes = emuharness.I32Bytes
	bytesF32 = emuharness.BytesF32
	bytesI32 = emuharness.BytesI32
)

// output returns the driver's fp32 output array name, checked for length.
func output(out map[string][]byte, name string, n int) ([]float32, error) {
	b, ok := out[name]
	if !ok {
		return nil, fmt.Errorf("driver returned no array %q", name)
	}
	if len(b) != 4*n {
		return nil, fmt.Errorf("array %q has %d bytes, want %d", name, len(b), 4*n)
	}
	return bytesF32(b), nil
}

// env is one check's run: the driver to use, its inputs' random source,
// and the largest error it has seen as a fraction of its tolerance (exact
// comparisons count any difference as 1), for the log: how much room each
// tolerance leaves.
type env struct {
	bin   string
	rng   *rand.Rand
	worst float64
}

// within compares got with want elementwise against tol(i) and describes
// the worst violation. NaN must match NaN.
func (e *env) within(got, want []float32, tol func(i int) float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d values, want %d", len(got), len(want))
	}
	bad, worst, wi := 0, 0.0, -1
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		var d float64
		switch {
		case math.IsNaN(g) && math.IsNaN(w):
			continue
		case math.IsNaN(g) || math.IsNaN(w):
			d = math.Inf(1)
		default:
			d = math.Abs(g - w)
		}
		tl := tol(i)
		if d > 0 {
			r := 1.0
			if tl > 0 {
				r = d / tl
			}
			e.worst = max(e.worst, r)
		}
		if d > tl {
			bad++
			if r := d / max(tl, 1e-300); r > worst || wi < 0 {
				worst, wi = r, i
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d values outside tolerance; worst at [%d]: got %g, want %g (tolerance %g)", bad, len(want), wi, got[wi], want[wi], tol(wi))
	}
	return nil
}

func exact(int) float64 { return 0 }
