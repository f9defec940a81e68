//go:build !amd64

package cpu

// archKernels: no assembly on this architecture; the Go kernels compile to
// native fused multiply-adds on arm64.
func archKernels() *kernelSet { return nil }
