package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cuda/ptx"
)

// Options choose the device.
type Options struct {
	// Device is the CUDA device ordinal.
	Device int
}

// Info describes the device a backend runs on.
type Info struct {
	Name          string
	Ordinal       int
	CC            [2]int // compute capability
	SMs           int
	TotalMem      uint64
	FreeMem       uint64
	DriverVersion int    // e.g. 12080 for CUDA 12.8
	Library       string // the libcuda.so.1 loaded
}

// Backend runs kernels.Backend's ops on one NVIDIA GPU. Ops are issued on
// one compute stream in call order; weights are uploaded on a copy stream
// and the compute stream waits for each upload's event, so an upload
// overlaps the compute issued before it.
type Backend struct {
	d                *driver
	info             Info
	dev              cuDevice
	ctx              cuContext
	compute, copying cuStream
	mods             map[string]cuModule
	funcs            map[string]cuFunc

	lt *lt // cuBLASLt, when enabled (cublaslt.go)

	// onLaunch, when set (tests), sees every launch's kernel and arguments.
	onLaunch func(mod, name string, args []any)

	mu    sync.Mutex
	pool  map[uint64][]devPtr // freed device blocks by size, reused in stream order
	inUse uint64
	host  map[unsafe.Pointer]int // pinned host allocations
}

var (
	_ kernels.Backend      = (*Backend)(nil)
	_ kernels.RowsViewer   = (*dbuf)(nil)
	_ kernels.DeviceMemory = (*Backend)(nil)
)

// minCC is the oldest GPU the committed sm_90 PTX loads on.
var minCC = [2]int{9, 0}

// Open loads the driver, makes the device's primary context current, and
// loads every kernel module. Its errors say what was found and what to do.
func Open(opt Options) (*Backend, error) {
	d, err := loadDriver()
	if err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.check("cuInit", d.cuInit(0)); err != nil {
		var ce *Error
		if errors.As(err, &ce) && ce.Name == "CUDA_ERROR_NO_DEVICE" {
			return nil, fmt.Errorf("cuda: the driver (%s) found no NVIDIA GPU: check nvidia-smi, or run with --backend cpu: %w", d.path, err)
		}
		return nil, fmt.Errorf("cuda: the driver (%s) failed to start (is the kernel module loaded? does nvidia-smi work?): %w", d.path, err)
	}
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: the driver (%s) found no NVIDIA GPU: check nvidia-smi, or run with --backend cpu", d.path)
	}
	if opt.Device < 0 || opt.Device >= int(n) {
		return nil, fmt.Errorf("cuda: device %d does not exist: the driver found %d GPU(s), ordinals 0..%d", opt.Device, n, n-1)
	}
	b := &Backend{d: d, mods: map[string]cuModule{}, funcs: map[string]cuFunc{}, pool: map[uint64][]devPtr{}, host: map[unsafe.Pointer]int{}}
	b.info.Library, b.info.Ordinal = d.path, opt.Device
	if err := b.initDevice(opt.Device); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Backend) initDevice(ordinal int) error {
	d := b.d
	var v int32
	if err := d.check("cuDriverGetVersion", d.cuDriverGetVersion(&v)); err != nil {
		return err
	}
	b.info.DriverVersion = int(v)
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&b.dev, int32(ordinal))); err != nil {
		return err
	}
	name := make([]byte, 256)
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), b.dev)); err != nil {
		return err
	}
	b.info.Name = cString(&name[0])
	attr := func(a int32) int {
		var x int32
		d.cuDeviceGetAttribute(&x, a, b.dev)
		return int(x)
	}
	b.info.CC = [2]int{attr(attrCCMajor), attr(attrCCMinor)}
	b.info.SMs = attr(attrMultiprocessors)
	if err := d.check("cuDeviceTotalMem", d.cuDeviceTotalMem(&b.info.TotalMem, b.dev)); err != nil {
		return err
	}
	if b.info.CC[0] < minCC[0] {
		return fmt.Errorf("cuda: %s has compute capability %d.%d; tandem's kernels are sm_%d%d PTX and need %d.%d or newer (Hopper, Blackwell): run with --backend cpu",
			b.info.Name, b.info.CC[0], b.info.CC[1], minCC[0], minCC[1], minCC[0], minCC[1])
	}
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&b.ctx, b.dev)); err != nil {
		return err
	}
	if err := d.check("cuCtxSetCurrent", d.cuCtxSetCurrent(b.ctx)); err != nil {
		return err
	}
	var total uint64
	if err := d.check("cuMemGetInfo", d.cuMemGetInfo(&b.info.FreeMem, &total)); err != nil {
		return err
	}
	if err := d.check("cuStreamCreate", d.cuStreamCreate(&b.compute, streamNonBlocking)); err != nil {
		return err
	}
	if err := d.check("cuStreamCreate", d.cuStreamCreate(&b.copying, streamNonBlocking)); err != nil {
		return err
	}
	mods := ptx.Modules()
	names := make([]string, 0, len(mods))
	for n := range mods {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		text := cBytes(mods[n])
		var m cuModule
		if err := d.check("cuModuleLoadData", d.cuModuleLoadData(&m, unsafe.Pointer(&text[0]))); err != nil {
			return fmt.Errorf("cuda: loading kernel module %s (%s PTX) on %s, driver %d: %w (a driver older than the PTX's ISA 7.8 needs an update to R520 or newer)",
				n, ptx.Arch, b.info.Name, b.info.DriverVersion, err)
		}
		b.mods[n] = m
	}
	return b.enableLt()
}

// DeviceMemory returns the device's free and total memory now.
func (b *Backend) DeviceMemory() (free, total int64) {
	b.enter()
	defer runtime.UnlockOSThread()
	var f, t uint64
	if b.d.cuMemGetInfo(&f, &t) != 0 {
		return int64(b.info.FreeMem), int64(b.info.TotalMem)
	}
	return int64(f), int64(t)
}

// Info returns what the backend found.
func (b *Backend) Info() Info { return b.info }

// Name names the device.
func (b *Backend) Name() string { return "cuda:" + b.info.Name }

// Threads: the host side of the backend is one issuing goroutine.
func (b *Backend) Threads() int { return 1 }

// Close releases the streams, modules and context.
func (b *Backend) Close() {
	if b.d == nil {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	if b.compute != 0 {
		b.d.cuStreamSynchronize(b.compute)
	}
	if b.lt != nil {
		b.lt.destroy(b.lt.handle)
		b.lt = nil
	}
	for _, ps := range b.pool {
		for _, p := range ps {
			b.d.cuMemFree(p)
		}
	}
	b.pool = map[uint64][]devPtr{}
	for _, m := range b.mods {
		b.d.cuModuleUnload(m)
	}
	clear(b.mods)
	for _, s := range []cuStream{b.compute, b.copying} {
		if s != 0 {
			b.d.cuStreamDestroy(s)
		}
	}
	b.compute, b.copying = 0, 0
	if b.ctx != 0 {
		b.d.cuDevicePrimaryCtxRelease(b.dev)
		b.ctx = 0
	}
}

// enter locks the goroutine to its OS thread and makes the context current
// there; callers unlock when done.
func (b *Backend) enter() {
	runtime.LockOSThread()
	if b.ctx != 0 {
		b.d.cuCtxSetCurrent(b.ctx)
	}
}

// must panics with the driver's error as a kernels.DeviceError: ops have no
// error result, a failed launch or copy leaves the batch's values undefined,
// and the executor fails the pass's jobs with it instead of the process.
func (b *Backend) must(op string, r cuResult) {
	if err := b.d.check(op, r); err != nil {
		panic(&kernels.DeviceError{Err: err})
	}
}

// dbuf is a device tensor's storage: a block from the pool (own) or a view
// of one.
type dbuf struct {
	p   devPtr
	n   uint64
	own bool
}

func (v *dbuf) RowsView(lo, hi, cols int) any {
	return &dbuf{p: v.p + devPtr(lo*cols*4), n: uint64((hi - lo) * cols * 4)}
}

// alloc returns a device block of n bytes (at least 1), from the pool when
// a freed block of the size is there: every use of a block is on the
// compute stream, so reuse is ordered after the last use.
func (b *Backend) alloc(n uint64) devPtr {
	n = max(n, 1)
	n = (n + 255) &^ 255
	b.mu.Lock()
	defer b.mu.Unlock()
	if ps := b.pool[n]; len(ps) > 0 {
		p := ps[len(ps)-1]
		b.pool[n] = ps[:len(ps)-1]
		b.inUse += n
		return p
	}
	var p devPtr
	r := b.d.cuMemAlloc(&p, n)
	if r != 0 {
		// Out of memory: give the pool back and try once more.
		b.d.cuStreamSynchronize(b.compute)
		for sz, ps := range b.pool {
			for _, q := range ps {
				b.d.cuMemFree(q)
			}
			delete(b.pool, sz)
		}
		r = b.d.cuMemAlloc(&p, n)
	}
	if err := b.d.check(fmt.Sprintf("cuMemAlloc(%d bytes, %d in use)", n, b.inUse), r); err != nil {
		panic(&kernels.DeviceError{Err: err})
	}
	b.inUse += n
	return p
}

func (b *Backend) release(p devPtr, n uint64) {
	n = (max(n, 1) + 255) &^ 255
	b.mu.Lock()
	b.pool[n] = append(b.pool[n], p)
	b.inUse -= n
	b.mu.Unlock()
}

// AllocHost returns pinned (page-locked) host memory: the weight streamer
// reads into it and Bind copies from it by DMA with no staging copy.
func (b *Backend) AllocHost(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("cuda: negative host allocation %d", n)
	}
	b.enter()
	defer runtime.UnlockOSThread()
	var p unsafe.Pointer
	if err := b.d.check(fmt.Sprintf("cuMemHostAlloc(%d bytes)", n), b.d.cuMemHostAlloc(&p, uint64(max(n, 1)), hostAllocPortable)); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.host[p] = n
	b.mu.Unlock()
	return unsafe.Slice((*byte)(p), n), nil
}

// FreeHost frees memory from AllocHost.
func (b *Backend) FreeHost(buf []byte) {
	if cap(buf) == 0 {
		return
	}
	p := unsafe.Pointer(unsafe.SliceData(buf))
	b.mu.Lock()
	_, ok := b.host[p]
	delete(b.host, p)
	b.mu.Unlock()
	if !ok {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.d.cuMemFreeHost(p)
}

// matDev is a bound weight's device copy.
type matDev struct {
	data, scales devPtr
	dn, sn       uint64
}

// Bind uploads a weight on the copy stream and makes the compute stream
// wait for it: the upload overlaps compute already issued.
func (b *Backend) Bind(m *kernels.Matrix) error {
	if err := m.Check(); err != nil {
		return err
	}
	b.enter()
	defer runtime.UnlockOSThread()
	md := &matDev{dn: uint64(len(m.Data)), sn: uint64(len(m.Scales))}
	md.data = b.alloc(md.dn)
	if err := b.d.check("cuMemcpyHtoDAsync("+m.Name+")", b.d.cuMemcpyHtoDAsync(md.data, unsafe.Pointer(unsafe.SliceData(m.Data)), md.dn, b.copying)); err != nil {
		b.release(md.data, md.dn)
		return err
	}
	if md.sn > 0 {
		md.scales = b.alloc(md.sn)
		if err := b.d.check("cuMemcpyHtoDAsync("+m.Name+" scales)", b.d.cuMemcpyHtoDAsync(md.scales, unsafe.Pointer(unsafe.SliceData(m.Scales)), md.sn, b.copying)); err != nil {
			b.release(md.data, md.dn)
			b.release(md.scales, md.sn)
			return err
		}
	}
	var ev cuEvent
	if err := b.d.check("cuEventCreate", b.d.cuEventCreate(&ev, eventDisableTime)); err != nil {
		return err
	}
	b.d.cuEventRecord(ev, b.copying)
	b.d.cuStreamWaitEvent(b.compute, ev, 0)
	b.d.cuEventDestroy(ev) // destroyed once complete; the wait stays valid
	m.Dev = md
	return nil
}

// Release frees a weight's device copy after the compute issued so far
// (which may read it) is done; then the host bytes it came from may be
// reused too.
func (b *Backend) Release(m *kernels.Matrix) {
	md, ok := m.Dev.(*matDev)
	if !ok {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.d.cuStreamSynchronize(b.compute)
	b.release(md.data, md.dn)
	if md.sn > 0 {
		b.release(md.scales, md.sn)
	}
	m.Dev = nil
}

// NewTensor allocates a zeroed device tensor.
func (b *Backend) NewTensor(rows, cols int) *kernels.Tensor {
	b.enter()
	defer runtime.UnlockOSThread()
	n := uint64(rows * cols * 4)
	p := b.alloc(n)
	b.must("cuMemsetD8Async", b.d.cuMemsetD8Async(p, 0, max(n, 1), b.compute))
	return &kernels.Tensor{Rows: rows, Cols: cols, Dev: &dbuf{p: p, n: n, own: true}}
}

// Free returns a tensor's block to the pool; views own nothing.
func (b *Backend) Free(t *kernels.Tensor) {
	if t == nil {
		return
	}
	if v, ok := t.Dev.(*dbuf); ok && v.own {
		b.release(v.p, v.n)
		v.own = false
	}
	t.Dev = nil
}

// ptr is a tensor's device address. A host tensor (a weight the model
// keeps as a Tensor, such as a conv kernel) is uploaded for the call; put
// it back with done.
func (b *Backend) ptr(t *kernels.Tensor) devPtr {
	if v, ok := t.Dev.(*dbuf); ok {
		return v.p
	}
	panic(fmt.Sprintf("cuda: %v is not a device tensor", t))
}

// temp uploads host values for one op; the block returns to the pool at
// once (its next use is ordered after this op on the compute stream).
func (b *Backend) temp(v any) devPtr {
	var p unsafe.Pointer
	var n uint64
	switch x := v.(type) {
	case []float32:
		p, n = unsafe.Pointer(unsafe.SliceData(x)), uint64(4*len(x))
	case []int32:
		p, n = unsafe.Pointer(unsafe.SliceData(x)), uint64(4*len(x))
	case []uint64:
		p, n = unsafe.Pointer(unsafe.SliceData(x)), uint64(8*len(x))
	default:
		panic(fmt.Sprintf("cuda: no upload for %T", v))
	}
	if n == 0 {
		return 0
	}
	d := b.alloc(n)
	// A pageable source: the driver copies it before the call returns.
	b.must("cuMemcpyHtoDAsync", b.d.cuMemcpyHtoDAsync(d, p, n, b.compute))
	b.release(d, n)
	return d
}

// hostTensor is the device address of a tensor that may live on the host.
func (b *Backend) hostTensor(t *kernels.Tensor) devPtr {
	if t.Dev != nil {
		return b.ptr(t)
	}
	return b.temp(t.Data)
}

// Upload copies host values into a device tensor.
func (b *Backend) Upload(dst *kernels.Tensor, src []float32) {
	if len(src) != dst.Rows*dst.Cols {
		panic(fmt.Sprintf("cuda.Upload: %d values into %v", len(src), dst))
	}
	if len(src) == 0 {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.must("cuMemcpyHtoDAsync", b.d.cuMemcpyHtoDAsync(b.ptr(dst), unsafe.Pointer(unsafe.SliceData(src)), uint64(4*len(src)), b.compute))
	b.must("cuStreamSynchronize", b.d.cuStreamSynchronize(b.compute))
}

// Download copies a device tensor's values to the host, after every op
// issued before it.
func (b *Backend) Download(dst []float32, src *kernels.Tensor) {
	if len(dst) != src.Rows*src.Cols {
		panic(fmt.Sprintf("cuda.Download: %v into %d values", src, len(dst)))
	}
	if len(dst) == 0 {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	b.must("cuMemcpyDtoHAsync", b.d.cuMemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), b.ptr(src), uint64(4*len(dst)), b.compute))
	b.must("cuStreamSynchronize", b.d.cuStreamSynchronize(b.compute))
}

// CopyBlock is a 2-D device-to-device copy. Within one tensor with the
// block moving up over itself, it copies bands no taller than the shift,
// in order, so no band overwrites rows still to be read.
func (b *Backend) CopyBlock(dst *kernels.Tensor, dr, dc int, src *kernels.Tensor, sr, sc, rows, cols int) {
	if rows < 0 || cols < 0 || dr < 0 || dc < 0 || sr < 0 || sc < 0 ||
		dr+rows > dst.Rows || dc+cols > dst.Cols || sr+rows > src.Rows || sc+cols > src.Cols {
		panic(fmt.Sprintf("cuda.CopyBlock: %dx%d from (%d,%d) of %v to (%d,%d) of %v", rows, cols, sr, sc, src, dr, dc, dst))
	}
	if rows == 0 || cols == 0 {
		return
	}
	b.enter()
	defer runtime.UnlockOSThread()
	dp, sp := b.ptr(dst), b.ptr(src)
	band := rows
	if dp == sp {
		switch {
		case dr == sr && dc == sc:
			return
		case dr > sr && dr < sr+rows:
			panic(fmt.Sprintf("cuda.CopyBlock: rows %d.. moved down over themselves to %d", sr, dr))
		case dr < sr && sr < dr+rows:
			band = sr - dr
		}
	}
	for r := 0; r < rows; r += band {
		h := min(band, rows-r)
		c := memcpy2D{srcX: uint64(4 * sc), srcY: uint64(sr + r), srcType: memTypeDevice, srcDevice: sp, srcPitch: uint64(4 * src.Cols),
			dstX: uint64(4 * dc), dstY: uint64(dr + r), dstType: memTypeDevice, dstDevice: dp, dstPitch: uint64(4 * dst.Cols),
			widthBytes: uint64(4 * cols), heightLines: uint64(h)}
		b.must("cuMemcpy2DAsync", b.d.cuMemcpy2DAsync(&c, b.compute))
	}
}

// AttachState uploads a sequence's state array for the layer's ops.
func (b *Backend) AttachState(host []float32, rows, cols int) *kernels.Tensor {
	if len(host) != rows*cols {
		panic(fmt.Sprintf("cuda.AttachState: %d values for [%d, %d]", len(host), rows, cols))
	}
	t := b.NewTensor(rows, cols)
	b.Upload(t, host)
	return t
}

// DetachState downloads the state into its host bytes and frees the
// device copy.
func (b *Backend) DetachState(t *kernels.Tensor, host []float32) {
	b.Download(host, t)
	b.Free(t)
}

// latentDev is an attached MLA cache on the device, in its dtype.
type latentDev struct {
	p    devPtr
	n    uint64
	bf16 bool
}

func latentBytes(c *kernels.LatentCache) (unsafe.Pointer, int, bool) {
	if c.BF16 != nil {
		return unsafe.Pointer(unsafe.SliceData(c.BF16)), 2, true
	}
	return unsafe.Pointer(unsafe.SliceData(c.F32)), 4, false
}

// AttachLatent uploads the cache's first valid rows into a device copy of
// the whole cache.
func (b *Backend) AttachLatent(c *kernels.LatentCache, valid int) {
	hp, es, bf := latentBytes(c)
	if c.BF16 == nil && c.F32 == nil || valid < 0 || valid > c.Rows {
		panic(fmt.Sprintf("cuda.AttachLatent: [%d, %d] cache with %d valid rows", c.Rows, c.Cols, valid))
	}
	b.enter()
	defer runtime.UnlockOSThread()
	ld := &latentDev{n: uint64(c.Rows * c.Cols * es), bf16: bf}
	ld.p = b.alloc(ld.n)
	if n := uint64(valid * c.Cols * es); n > 0 {
		b.must("cuMemcpyHtoDAsync", b.d.cuMemcpyHtoDAsync(ld.p, hp, n, b.compute))
	}
	c.Dev = ld
}

// DetachLatent downloads rows [from, Rows) into the host slices and frees
// the device copy.
func (b *Backend) DetachLatent(c *kernels.LatentCache, from int) {
	ld, ok := c.Dev.(*latentDev)
	if !ok {
		return
	}
	hp, es, _ := latentBytes(c)
	b.enter()
	defer runtime.UnlockOSThread()
	if n := uint64((c.Rows - from) * c.Cols * es); n > 0 {
		off := uint64(from * c.Cols * es)
		b.must("cuMemcpyDtoHAsync", b.d.cuMemcpyDtoHAsync(unsafe.Add(hp, off), ld.p+devPtr(off), n, b.compute))
	}
	b.must("cuStreamSynchronize", b.d.cuStreamSynchronize(b.compute))
	b.release(ld.p, ld.n)
	c.Dev = nil
}
