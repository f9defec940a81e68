//go:build linux

package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ebitengine/purego"
)

// libCandidates is where libcuda.so.1 is looked for, in order: the
// override, the dynamic loader's own search (ld.so.cache, LD_LIBRARY_PATH),
// then the places drivers are installed when the cache misses them (WSL,
// containers with the driver mounted, the toolkit's stubs are never used:
// they only fail at cuInit).
func libCandidates() []string {
	var c []string
	if p := os.Getenv(LibEnv); p != "" {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			p = filepath.Join(p, "libcuda.so.1")
		}
		return []string{p} // an explicit choice is the only one tried
	}
	c = append(c, "libcuda.so.1")
	for _, d := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib/wsl/lib", "/usr/local/nvidia/lib64", "/usr/lib/nvidia"} {
		c = append(c, filepath.Join(d, "libcuda.so.1"))
	}
	return c
}

// openLib loads the first library that opens.
func openLib(cands []string) (uintptr, string, error) {
	var first error
	for _, p := range cands {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err == nil {
			return h, p, nil
		}
		if first == nil {
			first = err
		}
	}
	return 0, "", first
}

// loadDriver binds libcuda.so.1's entry points.
func loadDriver() (*driver, error) {
	cands := libCandidates()
	h, path, err := openLib(cands)
	if err != nil {
		return nil, fmt.Errorf("%w (looked for %s: %v): install the NVIDIA driver (R520 or newer) for the GPU, or give its directory in %s; run with --backend cpu to use the CPU instead",
			ErrNoDriver, strings.Join(cands, ", "), err, LibEnv)
	}
	d := &driver{path: path}
	for _, s := range d.symbols() {
		sym, err := purego.Dlsym(h, s.name)
		if err != nil {
			return nil, fmt.Errorf("cuda: %s has no %s: the driver is too old for tandem (R520 or newer needed): %w", path, s.name, err)
		}
		purego.RegisterFunc(s.fn, sym)
	}
	return d, nil
}

// loadLt loads cuBLASLt: the pip wheels' directories under the Python site
// directories in TANDEM_CUBLASLT_DIRS (nvidia/cu13/lib for CUDA 13,
// nvidia/cublas/lib for 12), then the loader's path, then CUDA_HOME and
// CUDA_PATH, then /usr/local/cuda.
func loadLt() (*lt, error) {
	var cands []string
	sonames := []string{"libcublasLt.so.13", "libcublasLt.so.12"}
	for _, d := range filepath.SplitList(os.Getenv("TANDEM_CUBLASLT_DIRS")) {
		for _, sub := range []string{"", "nvidia/cu13/lib", "nvidia/cublas/lib"} {
			for _, so := range sonames {
				cands = append(cands, filepath.Join(d, sub, so))
			}
		}
	}
	cands = append(cands, sonames...)
	for _, root := range []string{os.Getenv("CUDA_HOME"), os.Getenv("CUDA_PATH"), "/usr/local/cuda"} {
		if root != "" {
			for _, so := range sonames {
				cands = append(cands, filepath.Join(root, "lib64", so))
			}
		}
	}
	h, path, err := openLib(cands)
	if err != nil {
		return nil, fmt.Errorf("cuda: cuBLASLt (libcublasLt.so.13 or .12) not found (%v): install it (pip's nvidia-cublas wheel: give its site directory in TANDEM_CUBLASLT_DIRS) or unset %s", err, LtEnv)
	}
	l := &lt{path: path}
	for _, s := range l.symbols() {
		sym, err := purego.Dlsym(h, s.name)
		if err != nil {
			return nil, fmt.Errorf("cuda: %s has no %s: %w", path, s.name, err)
		}
		purego.RegisterFunc(s.fn, sym)
	}
	return l, nil
}
