package emu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/kernels/conformance"
	"github.com/tandem-inference/tandem/kernels/internal/emuharness"
	"github.com/tandem-inference/tandem/kernels/metal"
	"github.com/tandem-inference/tandem/model/synth"
)

// The driver is built once per test run in two variants (and reused across
// runs when TANDEM_TEST_CACHE names a cache directory): the kernels as
// written, and with PLANTED_BUG, where each kernel carries a deliberate bug
// that TANDEM_PLANT=<kernel> switches on.
var (
	buildOnce sync.Once
	bins      []string
	buildErr  error
	cleanup   = func() {}
)

// dispatchTime bounds one dispatch in the emulator.
const dispatchTime = 5 * time.Minute

func TestMain(m *testing.M) {
	code := testkit.Isolated(m).Run()
	cleanup()
	os.Exit(code)
}

func spec() (emuharness.Spec, error) {
	src, err := filepath.Glob("../src/*.metal")
	if err != nil || len(src) == 0 {
		return emuharness.Spec{}, errors.Join(errors.New("no kernel sources in ../src"), err)
	}
	return emuharness.Spec{
		Name: "metalemu",
		// clang-19 is what scripts/setup.sh installs; any C++20 compiler does.
		Compilers: []string{"clang++-19", "clang++", "g++"},
		Flags: func(cxx string) []string {
			f := []string{"-std=c++20", "-O2", "-pthread", "-DMETALEMU", "-Wall", "-Wextra", "-Werror"}
			// MSL's [[buffer(i)]]-style attributes are unknown to a C++ compiler.
			if strings.Contains(filepath.Base(cxx), "clang") {
				return append(f, "-Wno-unknown-attributes")
			}
			return append(f, "-Wno-attributes")
		},
		Main:     "driver/driver.cc",
		Sources:  append(src, "metalemu.h", "driver/driver.cc", "../../internal/emuharness/driverio.h", "../../internal/kernelsrc/numerics.h"),
		Variants: []emuharness.Variant{{Name: "correct"}, {Name: "planted", Flags: []string{"-DPLANTED_BUG"}}},
	}, nil
}

func drivers(t *testing.T) (correct, planted string) {
	t.Helper()
	buildOnce.Do(func() {
		sp, err := spec()
		if err != nil {
			buildErr = err
			return
		}
		bins, cleanup, buildErr = emuharness.Build(sp)
	})
	if errors.Is(buildErr, emuharness.ErrNoCXX) {
		t.Skip(buildErr)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bins[0], bins[1]
}

// suite runs kernels/conformance's op cases (the CI subset: K3's widths,
// few rows and heads) on the Metal backend over the emulator.
func suite(t *testing.T, bin string, env []string, only []string) *conformance.Report {
	t.Helper()
	dev, err := Open(bin, env, dispatchTime)
	if err != nil {
		t.Fatal(err)
	}
	be := metal.New(dev)
	defer be.Close()
	rep, err := conformance.Run(context.Background(), be, conformance.Options{Short: true, Absorbed: true, Only: only, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d dispatches", dev.Dispatches())
	return rep
}

// TestConformance: every op of the Metal backend, run by the emulator,
// passes the conformance suite against the CPU backend.
func TestConformance(t *testing.T) {
	bin, _ := drivers(t)
	rep := suite(t, bin, nil, nil)
	for _, r := range rep.Results {
		t.Logf("%-4v %-28s %-40s rel %.2e max %.2e tol %.0e %.2fs %s", r.Pass, r.Name, r.Shape, r.Rel, r.Max, r.Tol, r.Seconds, r.Note)
	}
	if len(rep.Results) == 0 {
		t.Fatal("no cases ran")
	}
	for _, r := range rep.Failed() {
		t.Errorf("%s: rel %.3g, max %.3g over tolerance %.0e %s", r.Name, r.Rel, r.Max, r.Tol, r.Note)
	}
}

// planted maps each kernel to the conformance cases that use it: with the
// kernel's bug switched on, at least one of them must fail.
var planted = map[string][]string{
	"tandem_add":             {"add+mul_sigmoid"},
	"tandem_mul_sigmoid":     {"add+mul_sigmoid"},
	"tandem_add_bias":        {"addbias"},
	"tandem_sigmoid":         {"sigmoid"},
	"tandem_situ":            {"situ_mlp"},
	"tandem_kda_gate":        {"kda_gate"},
	"tandem_gather_rows":     {"routed_experts"},
	"tandem_moe_combine":     {"routed_experts"},
	"tandem_embed":           {"embed"},
	"tandem_copy_block":      {"copy_block"},
	"tandem_write_latent":    {"write_latent"},
	"tandem_attnres_score":   {"attnres_mix"},
	"tandem_softmax_rows":    {"attnres_mix"},
	"tandem_attnres_acc":     {"attnres_mix"},
	"tandem_rmsnorm":         {"rmsnorm/row"},
	"tandem_l2norm_groups":   {"l2norm"},
	"tandem_gemv":            {"matmul/F32", "matmul/MXFP4"},
	"tandem_router_topk":     {"router_topk"},
	"tandem_short_conv_silu": {"short_conv_silu"},
	"tandem_kda_recurrent":   {"kda/recurrent"},
	"tandem_mla_absorbed":    {"mla_attention/absorbed"},
}

// TestPlantedBugsAreCaught switches on one kernel's bug at a time: its
// cases must fail, or they could not catch a real bug in it.
func TestPlantedBugsAreCaught(t *testing.T) {
	_, bin := drivers(t)
	for k, cases := range planted {
		t.Run(k, func(t *testing.T) {
			rep := suite(t, bin, []string{"TANDEM_PLANT=" + k}, cases)
			if len(rep.Results) == 0 {
				t.Fatalf("no case matches %v", cases)
			}
			if len(rep.Failed()) == 0 {
				t.Errorf("the planted bug in %s passed %v", k, cases)
			}
			for _, r := range rep.Failed() {
				t.Logf("caught by %s: rel %.3g %s", r.Name, r.Rel, r.Note)
			}
		})
	}
}

// TestModelOnTheEmulator runs conformance's layer and model checks on the
// emulated GPU with the tiny synthetic model: every layer kind given the
// reference's input and state, the last-position logits, and states
// prefilled on the Metal backend that the CPU continues (greedy ids
// against the all-CPU path).
func TestModelOnTheEmulator(t *testing.T) {
	bin, _ := drivers(t)
	dir, err := synth.Ensure(context.Background(), synth.CacheDir(), "tiny", 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := Open(bin, nil, dispatchTime)
	if err != nil {
		t.Fatal(err)
	}
	be := metal.New(dev)
	defer be.Close()
	// No op case is named "-": only the layer and model checks run.
	rep, err := conformance.Run(context.Background(), be, conformance.Options{Short: true, ModelDir: dir, Only: []string{"-"}, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d dispatches", dev.Dispatches())
	if len(rep.Results) == 0 {
		t.Fatal("no checks ran")
	}
	for _, r := range rep.Results {
		t.Logf("%-4v %-22s %-40s rel %.2e max %.2e tol %.0e %s", r.Pass, r.Name, r.Shape, r.Rel, r.Max, r.Tol, r.Note)
	}
	for _, r := range rep.Failed() {
		t.Errorf("%s: rel %.3g, max %.3g over tolerance %.0e %s", r.Name, r.Rel, r.Max, r.Tol, r.Note)
	}
	if rep.Agreement < 1 {
		t.Errorf("greedy agreement with the all-CPU path %.3f, want 1", rep.Agreement)
	}
}
