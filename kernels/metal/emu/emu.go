// Package emu checks tandem's Metal kernels (kernels/metal/src) without a
// Mac: Device is a metal.Device that sends each dispatch to a driver
// process (driver/driver.cc), which runs the same MSL source compiled as
// C++20 with metalemu.h on CPU threads. With it, kernels/metal's Backend
// (everything above the Objective-C calls) runs kernels/conformance on
// Linux against the CPU backend; the package's tests do that, and once
// more per kernel with that kernel's planted bug switched on, which its
// checks must catch.
//
// No cgo: the emulator is a separate process the device talks to through
// pipes (kernels/internal/emuharness).
package emu

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/kernels/internal/emuharness"
	"github.com/tandem-inference/tandem/kernels/metal"
)

// Device is the emulated GPU. Buffers are Go memory; each dispatch sends
// the distinct buffers its arguments point into (so that aliased arguments
// alias in the emulator too) and copies back those a kernel may write.
// Dispatches run at once, so Wait has nothing to wait for.
type Device struct {
	mu        sync.Mutex
	s         *emuharness.Session
	used      int64
	dispatchN int
}

// Open starts the driver at bin. env (KEY=value) is passed to it, e.g.
// TANDEM_PLANT=<kernel> for a planted-bug build. timeout bounds one
// dispatch (a kernel whose barriers deadlock ends there).
func Open(bin string, env []string, timeout time.Duration) (*Device, error) {
	s, err := emuharness.Start(bin, env, timeout)
	if err != nil {
		return nil, err
	}
	return &Device{s: s}, nil
}

var _ metal.Device = (*Device)(nil)

func (d *Device) Name() string { return "emulator" }

type buffer struct {
	b []byte
	d *Device
}

func (b *buffer) Bytes() []byte { return b.b }
func (b *buffer) Release() {
	b.d.mu.Lock()
	b.d.used -= int64(len(b.b))
	b.d.mu.Unlock()
}

func (d *Device) NewBuffer(n int) (metal.Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("emu: buffer of %d bytes", n)
	}
	d.mu.Lock()
	d.used += int64(n)
	d.mu.Unlock()
	return &buffer{b: make([]byte, n), d: d}, nil
}

// WrapBuffer uses the host's bytes themselves, as Metal's no-copy buffers do.
func (d *Device) WrapBuffer(b []byte) (metal.Buffer, error) {
	d.mu.Lock()
	d.used += int64(len(b))
	d.mu.Unlock()
	return &buffer{b: b, d: d}, nil
}

func (d *Device) Dispatch(kernel string, groups, threads [3]int, args ...metal.Arg) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := map[string]float64{
		"gx": float64(groups[0]), "gy": float64(groups[1]), "gz": float64(groups[2]),
		"tx": float64(threads[0]), "ty": float64(threads[1]), "tz": float64(threads[2]),
		"nargs": float64(len(args)),
	}
	arrays := make(map[string][]byte)
	var bufs []*buffer
	index := make(map[*buffer]int)
	for i, a := range args {
		s := strconv.Itoa(i)
		switch {
		case a.Buf != nil:
			b, ok := a.Buf.(*buffer)
			if !ok {
				return fmt.Errorf("emu: argument %d of %s is a %T, not this device's buffer", i, kernel, a.Buf)
			}
			j, seen := index[b]
			if !seen {
				j = len(bufs)
				index[b] = j
				bufs = append(bufs, b)
				arrays["m"+strconv.Itoa(j)] = b.b
			}
			if a.Write {
				p["w"+strconv.Itoa(j)] = 1
			}
			p["k"+s], p["b"+s], p["o"+s] = 0, float64(j), float64(a.Off)
		case a.Bytes != nil:
			p["k"+s] = 1
			arrays["p"+s] = a.Bytes
		case a.Threadgroup > 0:
			p["k"+s], p["s"+s] = 2, float64(a.Threadgroup)
		default:
			return fmt.Errorf("emu: argument %d of %s is empty", i, kernel)
		}
	}
	out, err := d.s.Do(emuharness.Call{Op: kernel, Params: p, Arrays: arrays})
	if err != nil {
		return err
	}
	for j, b := range bufs {
		if got, ok := out["m"+strconv.Itoa(j)]; ok {
			if len(got) != len(b.b) {
				return fmt.Errorf("emu: %s returned %d bytes for a buffer of %d", kernel, len(got), len(b.b))
			}
			copy(b.b, got)
		}
	}
	d.dispatchN++
	return nil
}

// Dispatches is the number of dispatches run so far.
func (d *Device) Dispatches() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dispatchN
}

func (d *Device) Wait() error { return nil }

func (d *Device) Memory() (total, used int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return 64 << 30, d.used
}

func (d *Device) Close() error { return d.s.Close() }
