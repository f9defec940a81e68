// Package ptx holds tandem's CUDA kernels as PTX text for sm_90, compiled
// from kernels/cuda/src by gen.sh (Debian's clang-19) and committed, so that
// building and running tandem needs no CUDA toolkit: the device backend
// hands a module's text to the driver, which JIT-compiles it for the GPU
// present (sm_90 PTX also loads on newer architectures). The kernels'
// names, parameters and launch geometry are in kernels/cuda/src/ABI.md.
package ptx

//go:generate bash gen.sh

import (
	"embed"
	"io/fs"
	"strings"
)

// Arch is the virtual architecture the modules target.
const Arch = "sm_90"

//go:embed *.ptx
var files embed.FS

// Modules maps a module name (its source file without .cu: "gemm",
// "elementwise", ...) to its PTX text. The map is built per call; callers
// load each module once.
func Modules() map[string]string {
	m := make(map[string]string)
	names, _ := fs.Glob(files, "*.ptx") // the pattern is valid: no error
	for _, n := range names {
		b, _ := files.ReadFile(n) // embedded: cannot fail
		m[strings.TrimSuffix(n, ".ptx")] = string(b)
	}
	return m
}

// Module returns one module's PTX text.
func Module(name string) (string, bool) {
	b, err := files.ReadFile(name + ".ptx")
	return string(b), err == nil
}
