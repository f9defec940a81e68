package metal

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
)

// Backend runs the K3 ops on a Device. Tensors, attached states and
// latent caches live in shared-storage buffers; weights are the host's own
// bytes wrapped without a copy. Ops only encode dispatches; the host waits
// for the device where it reads or writes a buffer (Upload, Download,
// Detach*, RouterTopK's ids), so a layer's ops run as one stream.
type Backend struct {
	dev Device
}

var (
	_ kernels.Backend      = (*Backend)(nil)
	_ kernels.RowsViewer   = (*view)(nil)
	_ kernels.DeviceMemory = (*Backend)(nil)
)

// New returns a backend over dev (Open's device on a Mac, the emulator in
// tests).
func New(dev Device) *Backend { return &Backend{dev: dev} }

// Name is "metal:" and the device's name.
func (b *Backend) Name() string { return "metal:" + b.dev.Name() }

// Threads is 1: the host only encodes.
func (b *Backend) Threads() int { return 1 }

// DeviceMemory reports the device's working set: what is left of it, and
// its size.
func (b *Backend) DeviceMemory() (free, total int64) {
	total, used := b.dev.Memory()
	return max(0, total-used), total
}

// Close waits for the device and closes it.
func (b *Backend) Close() error {
	b.dev.Wait()
	return b.dev.Close()
}

// view is a tensor's place: a buffer and a byte offset; owner when the
// tensor holds the buffer (a view of rows of another tensor does not).
type view struct {
	buf   Buffer
	off   int
	owner bool
}

func (v *view) RowsView(lo, hi, cols int) any { return &view{buf: v.buf, off: v.off + 4*lo*cols} }

func (b *Backend) view(t *kernels.Tensor) *view {
	v, ok := t.Dev.(*view)
	if !ok {
		panic(fmt.Sprintf("metal: %v is not a tensor of this backend", t))
	}
	return v
}

// in and out are a tensor as a kernel argument, read or written.
func (b *Backend) in(t *kernels.Tensor) Arg {
	v := b.view(t)
	return Arg{Buf: v.buf, Off: v.off}
}

func (b *Backend) out(t *kernels.Tensor) Arg {
	a := b.in(t)
	a.Write = true
	return a
}

// devPage is the alignment of host memory the device can wrap: Apple
// Silicon's 16 KiB pages.
const devPage = 16 << 10

// AllocHost returns n bytes aligned to the device's page from the Go heap
// (which does not move), so that Bind wraps a streamed weight without a
// copy.
func (b *Backend) AllocHost(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("metal: negative host allocation %d", n)
	}
	raw := make([]byte, n+devPage)
	off := 0
	if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))) % devPage); r != 0 {
		off = devPage - r
	}
	return raw[off : off+n : off+n], nil
}

// FreeHost is a no-op: the collector reclaims AllocHost's memory.
func (b *Backend) FreeHost([]byte) {}

// matDev is a bound weight: its data and scales wrapped as buffers.
type matDev struct {
	data, scales Buffer
}

// Bind wraps the weight's bytes (an mmapped checkpoint's pages or a
// streamer buffer) as device buffers without copying them.
func (b *Backend) Bind(m *kernels.Matrix) error {
	if err := m.Check(); err != nil {
		return err
	}
	if _, ok := m.Dev.(*matDev); ok {
		return nil
	}
	md := &matDev{}
	var err error
	if md.data, err = b.dev.WrapBuffer(m.Data); err != nil {
		return fmt.Errorf("metal: binding %s (%d bytes): %w", m.Name, len(m.Data), err)
	}
	if len(m.Scales) > 0 {
		if md.scales, err = b.dev.WrapBuffer(m.Scales); err != nil {
			md.data.Release()
			return fmt.Errorf("metal: binding %s's scales (%d bytes): %w", m.Name, len(m.Scales), err)
		}
	} else {
		md.scales = md.data // bound, never read
	}
	m.Dev = md
	return nil
}

// Release drops the weight's buffers (its bytes stay the host's).
func (b *Backend) Release(m *kernels.Matrix) {
	md, ok := m.Dev.(*matDev)
	if !ok {
		return
	}
	b.wait("Release")
	md.data.Release()
	if md.scales != md.data {
		md.scales.Release()
	}
	m.Dev = nil
}

func (b *Backend) matrix(m *kernels.Matrix) *matDev {
	md, ok := m.Dev.(*matDev)
	if !ok {
		panic(fmt.Sprintf("metal: weight %s is not bound", m.Name))
	}
	return md
}

// weight is a bound matrix's data and scales arguments.
func (b *Backend) weight(m *kernels.Matrix) (Arg, Arg) {
	md := b.matrix(m)
	return Arg{Buf: md.data}, Arg{Buf: md.scales}
}

// buffer allocates n bytes (at least 4: Metal has no empty buffers).
func (b *Backend) buffer(op string, n int) Buffer {
	buf, err := b.dev.NewBuffer(max(n, 4))
	if err != nil {
		deviceFailed(op, fmt.Errorf("allocating %d bytes: %w", n, err))
	}
	return buf
}

// NewTensor allocates a zeroed tensor in shared storage.
func (b *Backend) NewTensor(rows, cols int) *kernels.Tensor {
	return &kernels.Tensor{Rows: rows, Cols: cols, Dev: &view{buf: b.buffer("NewTensor", 4*rows*cols), owner: true}}
}

// Free releases a tensor's buffer (Metal keeps it until the dispatches
// that use it have run). A view of another tensor owns nothing.
func (b *Backend) Free(t *kernels.Tensor) {
	if v, ok := t.Dev.(*view); ok && v.owner {
		v.buf.Release()
	}
	t.Dev = nil
}

func (b *Backend) wait(op string) {
	if err := b.dev.Wait(); err != nil {
		deviceFailed(op, err)
	}
}

func (b *Backend) dispatch(kernel string, groups, threads [3]int, args ...Arg) {
	if err := b.dev.Dispatch(kernel, groups, threads, args...); err != nil {
		deviceFailed(kernel, err)
	}
}

// f32s views a buffer's bytes as fp32 values.
func f32s(buf Buffer, off, n int) []float32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&buf.Bytes()[off])), n)
}

// Upload copies values into a tensor.
func (b *Backend) Upload(dst *kernels.Tensor, src []float32) {
	if len(src) != dst.Rows*dst.Cols {
		panic(fmt.Sprintf("metal.Upload: %d values into %v", len(src), dst))
	}
	v := b.view(dst)
	b.wait("Upload")
	copy(f32s(v.buf, v.off, len(src)), src)
}

// Download copies a tensor's values out.
func (b *Backend) Download(dst []float32, src *kernels.Tensor) {
	if len(dst) != src.Rows*src.Cols {
		panic(fmt.Sprintf("metal.Download: %v into %d values", src, len(dst)))
	}
	v := b.view(src)
	b.wait("Download")
	copy(dst, f32s(v.buf, v.off, len(dst)))
}

// temp uploads host values (fp32 or int32) into a new buffer for one op's
// dispatches; release it after encoding them (Metal keeps it alive while
// they are pending).
func (b *Backend) temp(op string, v any) Buffer {
	var raw []byte
	switch x := v.(type) {
	case []float32:
		raw = make([]byte, 4*len(x))
		for i, f := range x {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(f))
		}
	case []int32:
		raw = make([]byte, 4*len(x))
		for i, f := range x {
			binary.LittleEndian.PutUint32(raw[4*i:], uint32(f))
		}
	default:
		panic(fmt.Sprintf("metal: temp of %T", v))
	}
	buf := b.buffer(op, len(raw))
	copy(buf.Bytes(), raw)
	return buf
}

// f32Bytes views fp32 values as their bytes.
func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// AttachState wraps the state's own bytes as a device buffer (no copy:
// the memory is unified), so the ops update the state in place, and a
// state that arrived over kvtransfer is used where it was written.
func (b *Backend) AttachState(host []float32, rows, cols int) *kernels.Tensor {
	if len(host) != rows*cols {
		panic(fmt.Sprintf("metal.AttachState: %d values for [%d, %d]", len(host), rows, cols))
	}
	if len(host) == 0 {
		return b.NewTensor(rows, cols)
	}
	buf, err := b.dev.WrapBuffer(f32Bytes(host))
	if err != nil {
		deviceFailed("AttachState", err)
	}
	return &kernels.Tensor{Rows: rows, Cols: cols, Dev: &view{buf: buf, owner: true}}
}

// DetachState waits for the ops and drops the wrapping; the values are
// already in host (copied only when t is not host's wrapping).
func (b *Backend) DetachState(t *kernels.Tensor, host []float32) {
	v := b.view(t)
	b.wait("DetachState")
	if len(host) > 0 && &v.buf.Bytes()[v.off] != &f32Bytes(host)[0] {
		copy(host, f32s(v.buf, v.off, len(host)))
	}
	b.Free(t)
}

// latentDev is an attached latent cache: its host bytes wrapped.
type latentDev struct {
	buf  Buffer
	bf16 bool
}

func latentBytes(c *kernels.LatentCache) ([]byte, bool) {
	if c.BF16 != nil {
		if len(c.BF16) == 0 {
			return nil, true
		}
		return unsafe.Slice((*byte)(unsafe.Pointer(&c.BF16[0])), 2*len(c.BF16)), true
	}
	if len(c.F32) == 0 {
		return nil, false
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&c.F32[0])), 4*len(c.F32)), false
}

// AttachLatent wraps the cache's own bytes as a device buffer (no copy):
// WriteLatent writes the host rows directly.
func (b *Backend) AttachLatent(c *kernels.LatentCache, valid int) {
	host, bf16 := latentBytes(c)
	es := 4
	if bf16 {
		es = 2
	}
	if len(host) != c.Rows*c.Cols*es || valid < 0 || valid > c.Rows {
		panic(fmt.Sprintf("metal.AttachLatent: [%d, %d] cache of %d bytes, %d valid rows", c.Rows, c.Cols, len(host), valid))
	}
	var buf Buffer
	var err error
	if len(host) == 0 {
		buf, err = b.dev.NewBuffer(4)
	} else {
		buf, err = b.dev.WrapBuffer(host)
	}
	if err != nil {
		deviceFailed("AttachLatent", err)
	}
	c.Dev = &latentDev{buf: buf, bf16: bf16}
}

// DetachLatent waits for the ops (which wrote the host rows in place) and
// drops the wrapping.
func (b *Backend) DetachLatent(c *kernels.LatentCache, from int) {
	ld, ok := c.Dev.(*latentDev)
	if !ok {
		panic("metal.DetachLatent: cache not attached")
	}
	b.wait("DetachLatent")
	ld.buf.Release()
	c.Dev = nil
}
