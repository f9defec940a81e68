// Package emuharness is what the kernel emulators' tests share
// (kernels/cuda/emu, kernels/metal/emu): building a C++ driver program from
// the kernels' own sources with the host's compiler (cached by a hash of the
// compiler and every source), and talking to it through pipes in one small
// protocol (driverio.h is the driver's side of it).
//
// Protocol, both directions: a header line "op key=value ..." (requests
// only; values are numbers), then arrays as "name nbytes\n" followed by
// nbytes raw little-endian bytes, then "end\n". A driver may answer one
// request and exit (Run) or loop over requests until its input ends
// (Session).
//
// There is no cgo: the emulator is always a separate process.
package emuharness

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
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoCXX is Build's error when no C++20 compiler exists; tests skip on it.
var ErrNoCXX = errors.New("no C++20 compiler (g++ or clang++) on PATH: the kernels' emulator checks need one")

// Spec says how to build a driver.
type Spec struct {
	// Name prefixes the cache directory and temporary files ("cuemu").
	Name string
	// Compilers in order of preference, after $CXX.
	Compilers []string
	// Flags returns the compiler flags for the compiler at path cxx.
	Flags func(cxx string) []string
	// Main is the driver's source file, compiled alone (it includes the rest).
	Main string
	// Sources are every file the driver is built from (Main included): their
	// contents make the cache key.
	Sources []string
	// Variants are built from the same sources, each with its own extra
	// flags (e.g. -DPLANTED_BUG); Build returns one binary per variant.
	Variants []Variant
}

// Variant is one build of a driver.
type Variant struct {
	Name  string
	Flags []string
}

// Compiler returns the C++ compiler to use: $CXX, else the first of prefs
// on PATH.
func Compiler(prefs []string) (string, error) {
	for _, c := range append([]string{os.Getenv("CXX")}, prefs...) {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", ErrNoCXX
}

// Build compiles every variant of the driver (concurrently: they are
// independent) and returns their paths in Spec.Variants' order. Binaries
// are kept in $TANDEM_TEST_CACHE/<name> when that is set (and reused by
// later runs with the same compiler and sources), else in a temporary
// directory that cleanup removes.
func Build(spec Spec) (bins []string, cleanup func(), err error) {
	cleanup = func() {}
	cxx, err := Compiler(spec.Compilers)
	if err != nil {
		return nil, cleanup, err
	}
	flags := spec.Flags(cxx)
	h := sha256.New()
	ver, err := exec.Command(cxx, "--version").Output()
	if err != nil {
		return nil, cleanup, fmt.Errorf("%s --version: %w", cxx, err)
	}
	h.Write(ver)
	fmt.Fprintln(h, flags)
	for _, s := range spec.Sources {
		b, err := os.ReadFile(s)
		if err != nil {
			return nil, cleanup, err
		}
		fmt.Fprintf(h, "%s %d\n", s, len(b))
		h.Write(b)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	dir := os.Getenv("TANDEM_TEST_CACHE")
	if dir != "" {
		dir = filepath.Join(dir, spec.Name)
	} else {
		tmp, err := os.MkdirTemp("", spec.Name)
		if err != nil {
			return nil, cleanup, err
		}
		dir, cleanup = tmp, func() { os.RemoveAll(tmp) }
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, cleanup, err
	}
	bins = make([]string, len(spec.Variants))
	errs := make([]error, len(spec.Variants))
	var wg sync.WaitGroup
	for i, v := range spec.Variants {
		bins[i] = filepath.Join(dir, "driver-"+key+"-"+v.Name)
		if _, err := os.Stat(bins[i]); err == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append(append([]string(nil), flags...), v.Flags...)
			tmp := fmt.Sprintf("%s.%d.tmp", bins[i], os.Getpid())
			args = append(args, "-o", tmp, spec.Main)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, cxx, args...).CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("building the %s %s driver (%s %s): %w\n%s", v.Name, spec.Name, cxx, strings.Join(args, " "), err, out)
				return
			}
			errs[i] = os.Rename(tmp, bins[i]) // atomic: a concurrent run sees a whole binary or none
		}()
	}
	wg.Wait()
	return bins, cleanup, errors.Join(errs...)
}

// Call is one driver request: an op, its scalar parameters and its arrays.
type Call struct {
	Op     string
	Params map[string]float64
	Arrays map[string][]byte
}

// WriteTo writes the request in the protocol.
func (c Call) WriteTo(w io.Writer) (int64, error) {
	var in bytes.Buffer
	in.WriteString(c.Op)
	keys := make([]string, 0, len(c.Params))
	for k := range c.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&in, " %s=%s", k, strconv.FormatFloat(c.Params[k], 'g', -1, 64))
	}
	in.WriteByte('\n')
	keys = keys[:0]
	for k := range c.Arrays {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&in, "%s %d\n", k, len(c.Arrays[k]))
		in.Write(c.Arrays[k])
	}
	in.WriteString("end\n")
	return in.WriteTo(w)
}

// Run runs the driver at bin on one request with the extra environment env
// (KEY=value), and returns its output arrays. timeout bounds the run: a
// kernel whose barriers deadlock ends there.
func Run(bin string, c Call, env []string, timeout time.Duration) (map[string][]byte, error) {
	var in bytes.Buffer
	c.WriteTo(&in)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = &in
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("op %s: the emulator did not finish in %v (a barrier deadlock?)", c.Op, timeout)
		}
		return nil, fmt.Errorf("op %s: emulator driver: %w: %s", c.Op, err, strings.TrimSpace(stderr.String()))
	}
	return ReadOutput(c.Op, bufio.NewReader(&stdout))
}

// ReadOutput reads one answer: arrays up to "end".
func ReadOutput(op string, br *bufio.Reader) (map[string][]byte, error) {
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

// Session is a driver process that answers requests in turn until its
// input is closed.
type Session struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *bytes.Buffer
	wait   time.Duration
}

// Start starts the driver at bin with the extra environment env. timeout
// bounds each request's answer.
func Start(bin string, env []string, timeout time.Duration) (*Session, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s := &Session{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20), stderr: new(bytes.Buffer), wait: timeout}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the emulator driver %s: %w", bin, err)
	}
	return s, nil
}

// Do sends one request and reads its answer. A request that is not
// answered within the session's timeout kills the driver.
func (s *Session) Do(c Call) (map[string][]byte, error) {
	timer := time.AfterFunc(s.wait, func() { s.cmd.Process.Kill() })
	defer timer.Stop()
	bw := bufio.NewWriterSize(s.in, 1<<20)
	if _, err := c.WriteTo(bw); err != nil {
		return nil, s.failed(c.Op, err)
	}
	if err := bw.Flush(); err != nil {
		return nil, s.failed(c.Op, err)
	}
	out, err := ReadOutput(c.Op, s.out)
	if err != nil {
		return nil, s.failed(c.Op, err)
	}
	return out, nil
}

func (s *Session) failed(op string, err error) error {
	s.in.Close()
	s.cmd.Wait()
	msg := strings.TrimSpace(s.stderr.String())
	if msg == "" && s.cmd.ProcessState != nil && !s.cmd.ProcessState.Success() {
		msg = fmt.Sprintf("killed after %v without an answer (a barrier deadlock?): %v", s.wait, s.cmd.ProcessState)
	}
	return fmt.Errorf("op %s: emulator driver: %w: %s", op, err, msg)
}

// Close ends the driver.
func (s *Session) Close() error {
	s.in.Close()
	return s.cmd.Wait()
}

// F32Bytes and the functions below convert arrays to and from their
// little-endian bytes.
func F32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func I32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func BytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func BytesI32(b []byte) []int32 {
	v := make([]int32, len(b)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}
