//go:build !amd64

package cpu

// archKernels: no assembly on this architecture; the portable kernels run
// (their explicit math.FMA compiles to one instruction on arm64).
func archKernels() *kernelSet { return nil }
