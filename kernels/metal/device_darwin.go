//go:build darwin

package metal

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ebitengine/purego/objc"
)

// This file is Metal itself, reached through the Objective-C runtime with
// purego (no cgo). It builds and vets for darwin/arm64 but has NOT run:
// tandem's CI has no Mac. Everything it does is one of a few message
// shapes, each registered once as a typed objc_msgSend (objc.Send would
// register a function on every call).
//
// Threads: Metal objects are not tied to a thread, but autorelease pools
// are, so every entry point locks its goroutine to the OS thread between
// pushing and popping its pool.

// mtlSize is MTLSize (three NSUInteger), passed by value.
type mtlSize struct{ W, H, D uint64 }

var (
	rt struct {
		once sync.Once
		err  error

		createDevice func() objc.ID
		poolPush     func() uintptr
		poolPop      func(uintptr)

		send          func(id objc.ID, sel objc.SEL) objc.ID
		sendID        func(id objc.ID, sel objc.SEL, a objc.ID) objc.ID
		sendCStr      func(id objc.ID, sel objc.SEL, s *byte) objc.ID
		sendBool      func(id objc.ID, sel objc.SEL, v bool)
		sendLib       func(id objc.ID, sel objc.SEL, src, opts objc.ID, errp *objc.ID) objc.ID
		sendPipe      func(id objc.ID, sel objc.SEL, fn objc.ID, errp *objc.ID) objc.ID
		sendNewBuf    func(id objc.ID, sel objc.SEL, length, options uint64) objc.ID
		sendNoCopy    func(id objc.ID, sel objc.SEL, ptr uintptr, length, options uint64, dealloc objc.ID) objc.ID
		sendPtr       func(id objc.ID, sel objc.SEL) unsafe.Pointer
		sendUint      func(id objc.ID, sel objc.SEL) uint64
		sendVoid      func(id objc.ID, sel objc.SEL)
		sendSetObj    func(id objc.ID, sel objc.SEL, obj objc.ID)
		sendSetBuf    func(id objc.ID, sel objc.SEL, buf objc.ID, off, idx uint64)
		sendSetBytes  func(id objc.ID, sel objc.SEL, p unsafe.Pointer, length, idx uint64)
		sendSetTG     func(id objc.ID, sel objc.SEL, length, idx uint64)
		sendDispatch  func(id objc.ID, sel objc.SEL, groups, threads mtlSize)
		nsString      objc.Class
		compileOpts   objc.Class
		sel           map[string]objc.SEL
		selMu         sync.Mutex
		device, queue objc.ID
		library       objc.ID
	}
)

// sel returns a cached selector.
func sel(name string) objc.SEL {
	rt.selMu.Lock()
	defer rt.selMu.Unlock()
	s, ok := rt.sel[name]
	if !ok {
		s = objc.RegisterName(name)
		rt.sel[name] = s
	}
	return s
}

func initRuntime() error {
	rt.once.Do(func() {
		if runtime.GOARCH != "arm64" {
			rt.err = fmt.Errorf("%w (this Mac is %s)", ErrUnavailable, runtime.GOARCH)
			return
		}
		lib, err := purego.Dlopen("/usr/lib/libobjc.A.dylib", purego.RTLD_GLOBAL|purego.RTLD_NOW)
		if err != nil {
			rt.err = fmt.Errorf("metal: loading libobjc: %w", err)
			return
		}
		msg, err := purego.Dlsym(lib, "objc_msgSend")
		if err != nil {
			rt.err = fmt.Errorf("metal: objc_msgSend: %w", err)
			return
		}
		for _, fp := range []any{&rt.send, &rt.sendID, &rt.sendCStr, &rt.sendBool, &rt.sendLib, &rt.sendPipe, &rt.sendNewBuf, &rt.sendNoCopy,
			&rt.sendPtr, &rt.sendUint, &rt.sendVoid, &rt.sendSetObj, &rt.sendSetBuf, &rt.sendSetBytes, &rt.sendSetTG, &rt.sendDispatch} {
			purego.RegisterFunc(fp, msg)
		}
		purego.RegisterLibFunc(&rt.poolPush, lib, "objc_autoreleasePoolPush")
		purego.RegisterLibFunc(&rt.poolPop, lib, "objc_autoreleasePoolPop")
		mtl, err := purego.Dlopen("/System/Library/Frameworks/Metal.framework/Metal", purego.RTLD_GLOBAL|purego.RTLD_NOW)
		if err != nil {
			rt.err = fmt.Errorf("metal: loading Metal.framework: %w", err)
			return
		}
		if _, err := purego.Dlopen("/System/Library/Frameworks/Foundation.framework/Foundation", purego.RTLD_GLOBAL|purego.RTLD_NOW); err != nil {
			rt.err = fmt.Errorf("metal: loading Foundation.framework: %w", err)
			return
		}
		purego.RegisterLibFunc(&rt.createDevice, mtl, "MTLCreateSystemDefaultDevice")
		rt.sel = make(map[string]objc.SEL)
		rt.nsString = objc.GetClass("NSString")
		rt.compileOpts = objc.GetClass("MTLCompileOptions")
		rt.err = openDevice()
	})
	return rt.err
}

// pool runs fn inside an autorelease pool on one OS thread.
func pool(fn func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p := rt.poolPush()
	defer rt.poolPop(p)
	fn()
}

func nsString(s string) objc.ID {
	b := append([]byte(s), 0)
	return rt.sendCStr(objc.ID(rt.nsString), sel("stringWithUTF8String:"), &b[0])
}

func goString(ns objc.ID) string {
	if ns == 0 {
		return ""
	}
	p := (*byte)(rt.sendPtr(ns, sel("UTF8String")))
	if p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

func nsError(e objc.ID) string {
	if e == 0 {
		return "no error description"
	}
	return goString(rt.send(e, sel("localizedDescription")))
}

// openDevice makes the process's device, queue and library (compiled once
// from Source with fast math off: the kernels' numerics are stated for
// IEEE arithmetic).
func openDevice() error {
	var err error
	pool(func() {
		rt.device = rt.createDevice()
		if rt.device == 0 {
			err = fmt.Errorf("%w: MTLCreateSystemDefaultDevice returned no device", ErrUnavailable)
			return
		}
		rt.queue = rt.send(rt.device, sel("newCommandQueue"))
		opts := rt.send(rt.send(objc.ID(rt.compileOpts), sel("alloc")), sel("init"))
		rt.sendBool(opts, sel("setFastMathEnabled:"), false)
		var e objc.ID
		rt.library = rt.sendLib(rt.device, sel("newLibraryWithSource:options:error:"), nsString(Source()), opts, &e)
		rt.sendVoid(opts, sel("release"))
		if rt.library == 0 {
			err = fmt.Errorf("metal: compiling the kernels (newLibraryWithSource): %s", nsError(e))
		}
	})
	return err
}

// Open returns a backend on the Mac's GPU.
func Open() (*Backend, error) {
	if err := initRuntime(); err != nil {
		return nil, err
	}
	d := &mtlDevice{pipes: make(map[string]objc.ID)}
	pool(func() { d.name = goString(rt.send(rt.device, sel("name"))) })
	return New(d), nil
}

// mtlDevice is the Device over Metal: one command buffer and compute
// encoder open at a time, committed and waited for by Wait.
type mtlDevice struct {
	name   string
	mu     sync.Mutex
	pipes  map[string]objc.ID
	cmd    objc.ID // retained
	enc    objc.ID // retained
	copied int64   // bytes WrapBuffer had to copy
}

type mtlBuffer struct {
	id   objc.ID
	b    []byte
	base int // where b starts in the Metal buffer (a wrapped buffer starts at b's page)
	rel  sync.Once
}

func (b *mtlBuffer) Bytes() []byte { return b.b }
func (b *mtlBuffer) Release() {
	b.rel.Do(func() { pool(func() { rt.sendVoid(b.id, sel("release")) }) })
}

func (d *mtlDevice) Name() string { return d.name }

// storageShared is MTLResourceStorageModeShared with the default CPU cache
// mode and hazard tracking.
const storageShared = 0

func (d *mtlDevice) NewBuffer(n int) (Buffer, error) {
	var buf Buffer
	var err error
	pool(func() {
		id := rt.sendNewBuf(rt.device, sel("newBufferWithLength:options:"), uint64(n), storageShared)
		if id == 0 {
			err = fmt.Errorf("newBufferWithLength: %d bytes refused (device memory full?)", n)
			return
		}
		p := rt.sendPtr(id, sel("contents"))
		buf = &mtlBuffer{id: id, b: unsafe.Slice((*byte)(p), n)}
	})
	return buf, err
}

// WrapBuffer wraps the pages holding b (newBufferWithBytesNoCopy needs a
// page-aligned start and length), so mmapped weights and sequence states
// are used in place. Where Metal refuses, it copies once and counts the
// bytes (Copied); such a buffer is not b, which Backend.DetachState
// notices.
func (d *mtlDevice) WrapBuffer(b []byte) (Buffer, error) {
	if len(b) == 0 {
		return d.NewBuffer(4)
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	base := p &^ (devPage - 1)
	end := (p + uintptr(len(b)) + devPage - 1) &^ (devPage - 1)
	var buf Buffer
	pool(func() {
		id := rt.sendNoCopy(rt.device, sel("newBufferWithBytesNoCopy:length:options:deallocator:"), base, uint64(end-base), storageShared, 0)
		if id != 0 {
			buf = &mtlBuffer{id: id, b: b, base: int(p - base)}
		}
	})
	runtime.KeepAlive(b)
	if buf != nil {
		return buf, nil
	}
	nb, err := d.NewBuffer(len(b))
	if err != nil {
		return nil, err
	}
	copy(nb.Bytes(), b)
	d.mu.Lock()
	d.copied += int64(len(b))
	d.mu.Unlock()
	return nb, nil
}

// Copied is the number of weight bytes WrapBuffer had to copy.
func (d *mtlDevice) Copied() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.copied
}

func (d *mtlDevice) pipeline(name string) (objc.ID, error) {
	if p, ok := d.pipes[name]; ok {
		return p, nil
	}
	fn := rt.sendID(rt.library, sel("newFunctionWithName:"), nsString(name))
	if fn == 0 {
		return 0, fmt.Errorf("no kernel %q in the library", name)
	}
	var e objc.ID
	p := rt.sendPipe(rt.device, sel("newComputePipelineStateWithFunction:error:"), fn, &e)
	rt.sendVoid(fn, sel("release"))
	if p == 0 {
		return 0, fmt.Errorf("pipeline %s: %s", name, nsError(e))
	}
	if w := rt.sendUint(p, sel("threadExecutionWidth")); w != 32 {
		rt.sendVoid(p, sel("release"))
		return 0, fmt.Errorf("pipeline %s: SIMD width %d, the kernels assume 32", name, w)
	}
	d.pipes[name] = p
	return p, nil
}

func (d *mtlDevice) Dispatch(kernel string, groups, threads [3]int, args ...Arg) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var err error
	pool(func() {
		p, perr := d.pipeline(kernel)
		if perr != nil {
			err = perr
			return
		}
		if d.enc == 0 {
			d.cmd = rt.send(rt.send(rt.queue, sel("commandBuffer")), sel("retain"))
			d.enc = rt.send(rt.send(d.cmd, sel("computeCommandEncoder")), sel("retain"))
		}
		rt.sendSetObj(d.enc, sel("setComputePipelineState:"), p)
		for i, a := range args {
			switch {
			case a.Buf != nil:
				id, off := bufferID(a.Buf)
				rt.sendSetBuf(d.enc, sel("setBuffer:offset:atIndex:"), id, uint64(off+a.Off), uint64(i))
			case a.Bytes != nil:
				rt.sendSetBytes(d.enc, sel("setBytes:length:atIndex:"), unsafe.Pointer(&a.Bytes[0]), uint64(len(a.Bytes)), uint64(i))
			case a.Threadgroup > 0:
				// Threadgroup memory has its own index space: tandem's
				// kernels take at most one, at [[threadgroup(0)]].
				rt.sendSetTG(d.enc, sel("setThreadgroupMemoryLength:atIndex:"), uint64((a.Threadgroup+15)&^15), 0)
			}
		}
		rt.sendDispatch(d.enc, sel("dispatchThreadgroups:threadsPerThreadgroup:"),
			mtlSize{uint64(groups[0]), uint64(groups[1]), uint64(groups[2])}, mtlSize{uint64(threads[0]), uint64(threads[1]), uint64(threads[2])})
	})
	if err != nil {
		return fmt.Errorf("%s: %w", kernel, err)
	}
	return nil
}

// bufferID is the Metal buffer behind a Buffer and where the Buffer's
// bytes start in it.
func bufferID(b Buffer) (objc.ID, int) {
	if v, ok := b.(*mtlBuffer); ok {
		return v.id, v.base
	}
	panic(fmt.Sprintf("metal: a %T is not a Metal buffer", b))
}

// mtlStatusError is MTLCommandBufferStatusError.
const mtlStatusError = 5

func (d *mtlDevice) Wait() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.enc == 0 {
		return nil
	}
	var err error
	pool(func() {
		rt.sendVoid(d.enc, sel("endEncoding"))
		rt.sendVoid(d.cmd, sel("commit"))
		rt.sendVoid(d.cmd, sel("waitUntilCompleted"))
		if rt.sendUint(d.cmd, sel("status")) == mtlStatusError {
			err = errors.New("command buffer failed: " + nsError(rt.send(d.cmd, sel("error"))))
		}
		rt.sendVoid(d.enc, sel("release"))
		rt.sendVoid(d.cmd, sel("release"))
		d.enc, d.cmd = 0, 0
	})
	return err
}

func (d *mtlDevice) Memory() (total, used int64) {
	pool(func() {
		total = int64(rt.sendUint(rt.device, sel("recommendedMaxWorkingSetSize")))
		used = int64(rt.sendUint(rt.device, sel("currentAllocatedSize")))
	})
	return total, used
}

func (d *mtlDevice) Close() error {
	err := d.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	pool(func() {
		for _, p := range d.pipes {
			rt.sendVoid(p, sel("release"))
		}
	})
	d.pipes = nil
	return err
}
