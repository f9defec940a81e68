package emu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The emulator driver is built at most once per test run in each variant
// (and reused across runs when TANDEM_TEST_CACHE names a cache directory):
// the correct kernels, and the kernels with their planted bugs.
var (
	buildOnce  sync.Once
	buildBins  [2]string // [correct, planted]
	buildErr   error
	errNoCXX   = errors.New("no C++20 compiler (g++ or clang++) on PATH: the CUDA kernels' emulator checks need one")
	tempDir    string
	cxxFlags   = []string{"-std=c++20", "-O2", "-pthread", "-DCUEMU", "-Wall", "-Wextra", "-Werror"}
	driverTime = 3 * time.Minute // one driver run; a kernel whose barriers deadlock ends here
)

func TestMain(m *testing.M) {
	code := m.Run()
	if tempDir != "" {
		os.RemoveAll(tempDir)
	}
	os.Exit(code)
}

// compiler returns the C++ compiler to use: $CXX, else g++, else clang++.
func compiler() (string, error) {
	for _, c := range []string{os.Getenv("CXX"), "g++", "clang++", "clang++-19"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", errNoCXX
}

// sources are the files the driver is built from, relative to this package.
func sources() ([]string, error) {
	cu, err := filepath.Glob("../src/*.cu*")
	if err != nil {
		return nil, err
	}
	if len(cu) == 0 {
		return nil, errors.New("no kernel sources in ../src")
	}
	return append(cu, "cuemu.h", "driver/driver.cc"), nil
}

// drivers builds both variants (concurrently: they are independent) and
// returns their paths; t is skipped when no compiler exists.
func drivers(t *testing.T) (correct, planted string) {
	t.Helper()
	buildOnce.Do(func() { buildBins, buildErr = build() })
	if errors.Is(buildErr, errNoCXX) {
		t.Skip(buildErr)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBins[0], buildBins[1]
}

func build() (bins [2]string, err error) {
	cxx, err := compiler()
	if err != nil {
		return bins, err
	}
	srcs, err := sources()
	if err != nil {
		return bins, err
	}
	h := sha256.New()
	ver, err := exec.Command(cxx, "--version").Output()
	if err != nil {
		return bins, fmt.Errorf("%s --version: %w", cxx, err)
	}
	h.Write(ver)
	fmt.Fprintln(h, cxxFlags)
	for _, s := range srcs {
		b, err := os.ReadFile(s)
		if err != nil {
			return bins, err
		}
		fmt.Fprintf(h, "%s %d\n", s, len(b))
		h.Write(b)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	dir := os.Getenv("TANDEM_TEST_CACHE")
	if dir != "" {
		dir = filepath.Join(dir, "cuemu")
	} else {
		if tempDir, err = os.MkdirTemp("", "cuemu"); err != nil {
			return bins, err
		}
		dir = tempDir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return bins, err
	}
	var wg sync.WaitGroup
	var errs [2]error
	for i, variant := range []string{"correct", "planted"} {
		bins[i] = filepath.Join(dir, "driver-"+key+"-"+variant)
		if _, err := os.Stat(bins[i]); err == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append([]string(nil), cxxFlags...)
			if variant == "planted" {
				args = append(args, "-DPLANTED_BUG")
			}
			tmp := fmt.Sprintf("%s.%d.tmp", bins[i], os.Getpid())
			args = append(args, "-o", tmp, "driver/driver.cc")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, cxx, args...).CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("building the %s emulator driver (%s %s): %w\n%s", variant, cxx, strings.Join(args, " "), err, out)
				return
			}
			errs[i] = os.Rename(tmp, bins[i]) // atomic: a concurrent run sees a whole binary or none
		}()
	}
	wg.Wait()
	return bins, errors.Join(errs[0], errs[1])
}

// call is one driver request: an op, its scalar parameters and its arrays.
type call struct {
	op     string
	params map[string]float64
	arrays map[string][]byte
}

// run sends c to the driver at bin and returns its output arrays.
func run(bin string, c call) (map[string][]byte, error) {
	var in bytes.Buffer
	in.WriteString(c.op)
	keys := make([]string, 0, len(c.params))
	for k := range c.params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&in, " %s=%s", k, strconv.FormatFloat(c.params[k], 'g', -1, 64))
	}
	in.WriteByte('\n')
	keys = keys[:0]
	for k := range c.arrays {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&in, "%s %d\n", k, len(c.arrays[k]))
		in.Write(c.arrays[k])
	}
	in.WriteString("end\n")
	ctx, cancel := context.WithTimeout(context.Background(), driverTime)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Stdin = &in
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("op %s: the emulator did not finish in %v (a barrier deadlock?)", c.op, driverTime)
		}
		return nil, fmt.Errorf("op %s: emulator driver: %w: %s", c.op, err, strings.TrimSpace(stderr.String()))
	}
	return parseOutput(c.op, &stdout)
}

func parseOutput(op string, r io.Reader) (map[string][]byte, error) {
	br := bufio.NewReader(r)
	out := make(map[string][]byte)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("op %s: driver output ends without \"end\": %w", op, err)
		}
		f := strings.Fields(line)
		if len(f) == 1 && f[0] == "end" {
			return out, nil
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("op %s: bad driver output line %q", op, line)
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 0 || n > 1<<30 {
			return nil, fmt.Errorf("op %s: bad array size in %q", op, line)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return nil, fmt.Errorf("op %s: array %s: %w", op, f[0], err)
		}
		out[f[0]] = b
	}
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func bytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func bytesI32(b []byte) []int32 {
	v := make([]int32, len(b)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

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
