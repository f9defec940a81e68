package cuda

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
)

// In cuBLASLt's column-major terms, Y[T, O] = X[T, I] · Wᵀ is
// D[O, T] = op(A)·B with A = W viewed as [I, O], transposed, and B = X
// viewed as [I, T].

// LtEnv enables cuBLASLt when set to "1": BF16 GEMMs with fp32
// accumulation, MX weights decoded to BF16 by tandem_dequant_bf16 first and
// the fp32 activations rounded to BF16 the same way, as the F32 format. It
// is off by default: the binding has not yet run on a GPU, and the
// backend's own tensor-core GEMM, checked by the emulator, stays the
// default until `bench validate` has compared the two there.
const LtEnv = "TANDEM_CUBLASLT"

const (
	cudaR32F         = 0
	cudaR16BF        = 14
	cublasCompute32F = 68
	ltDescTransA     = 3
	ltDescTransB     = 4
	cublasOpN        = 0
	cublasOpT        = 1
	ltWorkspace      = 32 << 20
)

type lt struct {
	path   string
	handle uintptr
	ws     devPtr

	create           func(h *uintptr) int32
	destroy          func(h uintptr) int32
	descCreate       func(d *uintptr, compute, scale int32) int32
	descDestroy      func(d uintptr) int32
	descSetAttribute func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	layoutCreate     func(l *uintptr, ty int32, rows, cols uint64, ld int64) int32
	layoutDestroy    func(l uintptr) int32
	matmul           func(h, desc uintptr, alpha unsafe.Pointer, a devPtr, ad uintptr, b devPtr, bd uintptr, beta unsafe.Pointer, c devPtr, cd uintptr, d devPtr, dd uintptr, algo uintptr, ws devPtr, wsSize uint64, s cuStream) int32
	getStatusName    func(s int32) *byte
}

func (l *lt) symbols() []struct {
	name string
	fn   any
} {
	return []struct {
		name string
		fn   any
	}{
		{"cublasLtCreate", &l.create}, {"cublasLtDestroy", &l.destroy},
		{"cublasLtMatmulDescCreate", &l.descCreate}, {"cublasLtMatmulDescDestroy", &l.descDestroy},
		{"cublasLtMatmulDescSetAttribute", &l.descSetAttribute},
		{"cublasLtMatrixLayoutCreate", &l.layoutCreate}, {"cublasLtMatrixLayoutDestroy", &l.layoutDestroy},
		{"cublasLtMatmul", &l.matmul}, {"cublasLtGetStatusName", &l.getStatusName},
	}
}

func (l *lt) check(op string, st int32) {
	if st == 0 {
		return
	}
	name := ""
	if l.getStatusName != nil {
		name = cString(l.getStatusName(st))
	}
	panic(&kernels.DeviceError{Err: fmt.Errorf("cuda: cuBLASLt %s: status %d %s", op, st, name)})
}

// enableLt loads cuBLASLt when TANDEM_CUBLASLT=1; a missing library is an
// error then (the user asked for it).
func (b *Backend) enableLt() error {
	if os.Getenv(LtEnv) != "1" {
		return nil
	}
	l, err := loadLt()
	if err != nil {
		return fmt.Errorf("%s=1: %w", LtEnv, err)
	}
	if st := l.create(&l.handle); st != 0 {
		return fmt.Errorf("cuda: cublasLtCreate (%s): status %d", l.path, st)
	}
	l.ws = b.alloc(ltWorkspace)
	b.lt = l
	return nil
}

// ltGemm is y = x·Wᵀ through cuBLASLt.
func (b *Backend) ltGemm(y, x devPtr, T int, w *kernels.Matrix) {
	l, md := b.lt, b.matrix(w)
	O, I := w.Rows, w.Cols
	wb := md.data
	if w.Format != kernels.BF16 {
		n := uint64(O * I * 2)
		wb = b.alloc(n)
		defer b.release(wb, n)
		b.launch("elementwise", "tandem_dequant_bf16", strided(O*I), block256, wb, md.data, md.scales, i32(w.Format), i64(O), i32(I))
	}
	xn := uint64(T * I * 2)
	xb := b.alloc(xn)
	defer b.release(xb, xn)
	b.launch("elementwise", "tandem_dequant_bf16", strided(T*I), block256, xb, x, devPtr(0), i32(kernels.F32), i64(T), i32(I))

	var desc, ad, bd, dd uintptr
	l.check("MatmulDescCreate", l.descCreate(&desc, cublasCompute32F, cudaR32F))
	defer l.descDestroy(desc)
	ta, tb := int32(cublasOpT), int32(cublasOpN)
	l.check("MatmulDescSetAttribute(TRANSA)", l.descSetAttribute(desc, ltDescTransA, unsafe.Pointer(&ta), 4))
	l.check("MatmulDescSetAttribute(TRANSB)", l.descSetAttribute(desc, ltDescTransB, unsafe.Pointer(&tb), 4))
	l.check("MatrixLayoutCreate(A)", l.layoutCreate(&ad, cudaR16BF, uint64(I), uint64(O), int64(I)))
	defer l.layoutDestroy(ad)
	l.check("MatrixLayoutCreate(B)", l.layoutCreate(&bd, cudaR16BF, uint64(I), uint64(T), int64(I)))
	defer l.layoutDestroy(bd)
	l.check("MatrixLayoutCreate(D)", l.layoutCreate(&dd, cudaR32F, uint64(O), uint64(T), int64(O)))
	defer l.layoutDestroy(dd)
	alpha, beta := float32(1), float32(0)
	l.check("Matmul", l.matmul(l.handle, desc, unsafe.Pointer(&alpha), wb, ad, xb, bd, unsafe.Pointer(&beta), y, dd, y, dd, 0, l.ws, ltWorkspace, b.compute))
}
