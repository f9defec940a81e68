// Package cuda is the NVIDIA GPU backend: kernels.Backend on the CUDA driver
// API, bound at run time without cgo (github.com/ebitengine/purego opens
// libcuda.so.1), running the kernels of kernels/cuda/src from their
// committed PTX (kernels/cuda/ptx; launch contract in src/ABI.md).
//
// Building needs no CUDA toolkit and no cgo; running needs an NVIDIA driver
// (R520 or newer for the sm_90 PTX). Without one, Open returns an error
// that names what is missing and what to do. On other systems than Linux
// the package compiles and Open reports that CUDA is not supported there.
//
// Threads: a CUDA context is current per OS thread, so every entry point
// locks its goroutine to its thread and makes the backend's context
// current for the call (cheap: a thread-local store in the driver).
package cuda

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrNoDriver is wrapped by Open's error when the driver library could not
// be loaded.
var ErrNoDriver = errors.New("cuda: the NVIDIA driver library libcuda.so.1 was not found")

// ErrUnsupported is wrapped by Open's error on systems without CUDA.
var ErrUnsupported = errors.New("cuda: CUDA not supported on this OS")

// LibEnv names a file or directory to load libcuda.so.1 from first.
const LibEnv = "TANDEM_CUDA_LIB"

type (
	cuResult  int32
	cuDevice  int32
	cuContext uintptr
	cuStream  uintptr
	cuEvent   uintptr
	cuModule  uintptr
	cuFunc    uintptr
	devPtr    uint64
)

// memcpy2D mirrors CUDA_MEMCPY2D (LP64: Go's alignment of the 8-byte
// fields puts the same padding after the two memory-type enums).
type memcpy2D struct {
	srcX, srcY  uint64
	srcType     uint32
	srcHost     unsafe.Pointer
	srcDevice   devPtr
	srcArray    uintptr
	srcPitch    uint64
	dstX, dstY  uint64
	dstType     uint32
	dstHost     unsafe.Pointer
	dstDevice   devPtr
	dstArray    uintptr
	dstPitch    uint64
	widthBytes  uint64
	heightLines uint64
}

const (
	memTypeHost   = 1
	memTypeDevice = 2

	attrMultiprocessors = 16 // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
	attrCCMajor         = 75
	attrCCMinor         = 76

	streamNonBlocking = 1
	eventDisableTime  = 2
	hostAllocPortable = 1
)

// driver holds the bound entry points. Every function returns a CUresult.
type driver struct {
	path string

	cuInit                    func(flags uint32) cuResult
	cuDriverGetVersion        func(v *int32) cuResult
	cuDeviceGetCount          func(n *int32) cuResult
	cuDeviceGet               func(d *cuDevice, ordinal int32) cuResult
	cuDeviceGetName           func(name *byte, n int32, d cuDevice) cuResult
	cuDeviceTotalMem          func(b *uint64, d cuDevice) cuResult
	cuDeviceGetAttribute      func(v *int32, attr int32, d cuDevice) cuResult
	cuDevicePrimaryCtxRetain  func(c *cuContext, d cuDevice) cuResult
	cuDevicePrimaryCtxRelease func(d cuDevice) cuResult
	cuCtxSetCurrent           func(c cuContext) cuResult
	cuCtxSynchronize          func() cuResult
	cuMemGetInfo              func(free, total *uint64) cuResult
	cuStreamCreate            func(s *cuStream, flags uint32) cuResult
	cuStreamDestroy           func(s cuStream) cuResult
	cuStreamSynchronize       func(s cuStream) cuResult
	cuStreamWaitEvent         func(s cuStream, e cuEvent, flags uint32) cuResult
	cuEventCreate             func(e *cuEvent, flags uint32) cuResult
	cuEventRecord             func(e cuEvent, s cuStream) cuResult
	cuEventSynchronize        func(e cuEvent) cuResult
	cuEventElapsedTime        func(ms *float32, start, end cuEvent) cuResult
	cuEventDestroy            func(e cuEvent) cuResult
	cuMemAlloc                func(p *devPtr, n uint64) cuResult
	cuMemFree                 func(p devPtr) cuResult
	cuMemHostAlloc            func(p *unsafe.Pointer, n uint64, flags uint32) cuResult
	cuMemFreeHost             func(p unsafe.Pointer) cuResult
	cuMemcpyHtoDAsync         func(dst devPtr, src unsafe.Pointer, n uint64, s cuStream) cuResult
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src devPtr, n uint64, s cuStream) cuResult
	cuMemcpyDtoDAsync         func(dst, src devPtr, n uint64, s cuStream) cuResult
	cuMemcpy2DAsync           func(p *memcpy2D, s cuStream) cuResult
	cuMemsetD8Async           func(dst devPtr, v uint8, n uint64, s cuStream) cuResult
	cuModuleLoadData          func(m *cuModule, image unsafe.Pointer) cuResult
	cuModuleUnload            func(m cuModule) cuResult
	cuModuleGetFunction       func(f *cuFunc, m cuModule, name *byte) cuResult
	cuLaunchKernel            func(f cuFunc, gx, gy, gz, bx, by, bz, shared uint32, s cuStream, params, extra unsafe.Pointer) cuResult
	cuGetErrorName            func(r cuResult, s **byte) cuResult
	cuGetErrorString          func(r cuResult, s **byte) cuResult
}

// symbols lists each entry point with its exported name: the _v2 names are
// what the CUDA headers map the plain names to (the plain symbols are the
// old ABI, kept for old binaries).
func (d *driver) symbols() []struct {
	name string
	fn   any
} {
	return []struct {
		name string
		fn   any
	}{
		{"cuInit", &d.cuInit},
		{"cuDriverGetVersion", &d.cuDriverGetVersion},
		{"cuDeviceGetCount", &d.cuDeviceGetCount},
		{"cuDeviceGet", &d.cuDeviceGet},
		{"cuDeviceGetName", &d.cuDeviceGetName},
		{"cuDeviceTotalMem_v2", &d.cuDeviceTotalMem},
		{"cuDeviceGetAttribute", &d.cuDeviceGetAttribute},
		{"cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &d.cuDevicePrimaryCtxRelease},
		{"cuCtxSetCurrent", &d.cuCtxSetCurrent},
		{"cuCtxSynchronize", &d.cuCtxSynchronize},
		{"cuMemGetInfo_v2", &d.cuMemGetInfo},
		{"cuStreamCreate", &d.cuStreamCreate},
		{"cuStreamDestroy_v2", &d.cuStreamDestroy},
		{"cuStreamSynchronize", &d.cuStreamSynchronize},
		{"cuStreamWaitEvent", &d.cuStreamWaitEvent},
		{"cuEventCreate", &d.cuEventCreate},
		{"cuEventRecord", &d.cuEventRecord},
		{"cuEventSynchronize", &d.cuEventSynchronize},
		{"cuEventElapsedTime", &d.cuEventElapsedTime},
		{"cuEventDestroy_v2", &d.cuEventDestroy},
		{"cuMemAlloc_v2", &d.cuMemAlloc},
		{"cuMemFree_v2", &d.cuMemFree},
		{"cuMemHostAlloc", &d.cuMemHostAlloc},
		{"cuMemFreeHost", &d.cuMemFreeHost},
		{"cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync},
		{"cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync},
		{"cuMemcpyDtoDAsync_v2", &d.cuMemcpyDtoDAsync},
		{"cuMemcpy2DAsync_v2", &d.cuMemcpy2DAsync},
		{"cuMemsetD8Async", &d.cuMemsetD8Async},
		{"cuModuleLoadData", &d.cuModuleLoadData},
		{"cuModuleUnload", &d.cuModuleUnload},
		{"cuModuleGetFunction", &d.cuModuleGetFunction},
		{"cuLaunchKernel", &d.cuLaunchKernel},
		{"cuGetErrorName", &d.cuGetErrorName},
		{"cuGetErrorString", &d.cuGetErrorString},
	}
}

// Error is a failed driver call.
type Error struct {
	Op     string
	Code   int
	Name   string // CUDA_ERROR_..., when the driver could name it
	Detail string
}

func (e *Error) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Op, e.Name, e.Code, e.Detail)
	}
	return fmt.Sprintf("cuda: %s: error %d", e.Op, e.Code)
}

// check turns a CUresult into an error naming the call.
func (d *driver) check(op string, r cuResult) error {
	if r == 0 {
		return nil
	}
	e := &Error{Op: op, Code: int(r)}
	var s *byte
	if d.cuGetErrorName != nil && d.cuGetErrorName(r, &s) == 0 {
		e.Name = cString(s)
	}
	if d.cuGetErrorString != nil && d.cuGetErrorString(r, &s) == 0 {
		e.Detail = cString(s)
	}
	return e
}

// cString copies a NUL-terminated C string (at most 4 KiB of it).
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for i := 0; i < 4096; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// cBytes is s as a NUL-terminated byte slice.
func cBytes(s string) []byte { return append([]byte(s), 0) }
