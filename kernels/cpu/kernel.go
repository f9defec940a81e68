package cpu

// kernelsInUse are the tile kernels every GEMM runs: the assembly of this
// CPU when it has them (kernel_amd64.go), the portable Go ones otherwise.
// Both compute identical bits; tests switch between them.
var kernelsInUse = selectKernels()

func selectKernels() *tileKernels {
	if k := archKernels(); k != nil {
		return k
	}
	return &goKernels
}

// KernelName names the GEMM kernels in use ("avx2" or "go"), for reports.
func KernelName() string { return kernelsInUse.name }
