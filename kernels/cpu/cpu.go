// Package cpu is the reference backend: every op of kernels.Backend on the
// host, parallel across cores with goroutines. Activations are fp32 between
// ops; matrix products accumulate each output in one fp64 fused
// multiply-add chain in k order (MatMul), recurrences and reductions run in
// fp64. It is the reference every other backend is checked against.
//
// The inner loops run on a kernel set (kernel.go): AVX2+FMA assembly on
// amd64 CPUs that have it, portable Go elsewhere (and with
// GODEBUG=cpu.avx2=off). Every set computes the same bits: the assembly
// vectorises across independent outputs only, never reorders a sum, and
// reproduces the scalar code's roundings (including exp and tanh,
// internal/expmath); tests compare them on random inputs. The portable
// code gives the same bits on amd64 and arm64: it calls math.FMA where it
// fuses and rounds every other product (float64()) before the sum it
// feeds, since Go fuses a*b+c on arm64 and not on amd64, and it takes exp
// and tanh from internal/expmath, not package math.
package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
)

// Backend is the CPU backend. The zero value is not usable; call New.
type Backend struct {
	threads int
}

var _ kernels.Backend = (*Backend)(nil)

// New returns a CPU backend using up to threads goroutines per op
// (0 means GOMAXPROCS).
func New(threads int) *Backend {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	return &Backend{threads: threads}
}

func (b *Backend) Name() string { return "cpu" }
func (b *Backend) Threads() int { return b.threads }

// pageSize is the alignment of staging buffers (direct I/O needs the
// logical block size; 4 KiB covers every filesystem we read from).
const pageSize = 4096

// AllocHost returns n bytes aligned to a page, from the Go heap: the CPU
// backend computes straight from these bytes, so there is nothing to pin.
func (b *Backend) AllocHost(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("cpu: negative host allocation %d", n)
	}
	raw := make([]byte, n+pageSize)
	off := 0
	if r := int(uintptrOf(raw) % pageSize); r != 0 {
		off = pageSize - r
	}
	return raw[off : off+n : off+n], nil
}

// FreeHost drops the buffer; the garbage collector reclaims it.
func (b *Backend) FreeHost([]byte) {}

// Bind is a no-op: the CPU computes on the host bytes in place.
func (b *Backend) Bind(m *kernels.Matrix) error { return m.Check() }

// Release is a no-op on the CPU.
func (b *Backend) Release(*kernels.Matrix) {}

func (b *Backend) NewTensor(rows, cols int) *kernels.Tensor {
	return &kernels.Tensor{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
}

func (b *Backend) Upload(dst *kernels.Tensor, src []float32) { copy(dst.Data, src) }

func (b *Backend) Download(dst []float32, src *kernels.Tensor) { copy(dst, src.Data) }

// parallel runs fn over [0, n) in chunks of grain, on up to b.threads
// goroutines with dynamic scheduling (work stealing by an atomic cursor), so
// uneven chunks (e.g. experts with different row counts) balance.
func (b *Backend) parallel(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	chunks := (n + grain - 1) / grain
	workers := b.threads
	if workers > chunks {
		workers = chunks
	}
	if workers <= 1 {
		fn(0, n)
		return
	}
	var next atomic.Int64
	work := func() {
		for {
			c := int(next.Add(1) - 1)
			if c >= chunks {
				return
			}
			lo := c * grain
			fn(lo, min(lo+grain, n))
		}
	}
	// The calling goroutine is one of the workers: one fewer goroutine to
	// start and wake per op, which a decode step does hundreds of times.
	var wg sync.WaitGroup
	wg.Add(workers - 1)
	for w := 1; w < workers; w++ {
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
}

// grainFor picks a chunk size that gives each worker several chunks.
func (b *Backend) grainFor(n int) int {
	g := n / (b.threads * 4)
	if g < 1 {
		g = 1
	}
	return g
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
