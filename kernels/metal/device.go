// Package metal runs kernels.Backend's ops on an Apple Silicon GPU through
// Metal, without cgo: the kernels are Metal Shading Language source in src/
// (embedded, compiled once per process by the system's compiler), and the
// ops here encode their dispatches onto a Device.
//
// The Device is the seam: on macOS it is Metal itself (device_darwin.go,
// through purego's objc runtime calls); in tests it is the host emulator
// (kernels/metal/emu), which runs the same MSL source compiled as C++. So
// everything above the Objective-C calls (argument layouts, dispatch
// geometry, buffer offsets, the composite ops' steps) is checked on Linux
// against the CPU backend by kernels/conformance. What only a Mac can check
// is said in README.md; none of it has run on one yet.
package metal

import (
	"errors"
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
)

// ErrUnavailable is Open's error where Metal does not exist.
var ErrUnavailable = errors.New("metal: Metal is only available on macOS on Apple Silicon")

// Device is what the backend needs of a GPU: shared-storage buffers (the
// host reads and writes their bytes directly: Apple Silicon's memory is
// unified) and kernels dispatched in order.
type Device interface {
	// Name describes the device ("Apple M2 Ultra").
	Name() string
	// NewBuffer returns n zeroed bytes of shared storage.
	NewBuffer(n int) (Buffer, error)
	// WrapBuffer makes host memory usable by kernels without copying it
	// (mmapped weights, sequence states): the buffer's bytes are b, and its
	// offsets count from b's start. The memory must stay valid until the
	// buffer is released.
	WrapBuffer(b []byte) (Buffer, error)
	// Dispatch encodes one kernel launch: groups threadgroups of threads
	// each (both x, y, z). Dispatches run in the order encoded, each seeing
	// the memory effects of the ones before.
	Dispatch(kernel string, groups, threads [3]int, args ...Arg) error
	// Wait returns when every dispatch encoded so far has finished; only
	// then may the host touch buffers they use.
	Wait() error
	// Memory returns the bytes the device can use well (Metal's
	// recommendedMaxWorkingSetSize) and those in use.
	Memory() (total, used int64)
	Close() error
}

// Buffer is device memory the host can address.
type Buffer interface {
	// Bytes is the buffer's contents, shared with the device.
	Bytes() []byte
	Release()
}

// Arg is one kernel argument, in the kernel's order: a buffer at a byte
// offset (Write when the kernel may write it), constant bytes (the kernel's
// parameter struct), or Threadgroup bytes of threadgroup memory.
type Arg struct {
	Buf         Buffer
	Off         int
	Write       bool
	Bytes       []byte
	Threadgroup int
}

// deviceFailed is the panic of an op whose dispatch or wait failed (ops
// have no error result; see kernels.DeviceError).
func deviceFailed(op string, err error) {
	panic(&kernels.DeviceError{Err: fmt.Errorf("metal %s: %w", op, err)})
}
