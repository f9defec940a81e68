// Package kernels is the compute backend interface the K3 model is written
// against, and the types it moves: activation tensors and weight matrices in
// their checkpoint storage formats.
//
// Ops are coarse (a whole projection, a chunk of KDA for one sequence, one
// expert over its routed rows) so that a device backend does real work per
// call. The cpu subpackage is the reference implementation; device backends
// (CUDA, Metal) plug in behind build tags and must pass the same conformance
// suite.
package kernels

import (
	"fmt"
	"math"
)

// Tensor is an fp32 activation or state tensor [Rows, Cols], row-major.
// Data holds the values when the tensor lives in host memory (the CPU
// backend, Apple unified memory); a device backend keeps its own handle in
// Dev and leaves Data nil. Code above the backend (model, executor) never
// reads or writes Data of a tensor it did not make itself: it moves values
// only through Backend.Upload / Download / CopyBlock and the state
// attachments, so that the same code runs on every backend.
type Tensor struct {
	Rows, Cols int
	Data       []float32
	Dev        any
}

// Row returns row r of a host tensor.
func (t *Tensor) Row(r int) []float32 { return t.Data[r*t.Cols : (r+1)*t.Cols] }

// RowsViewer is implemented by a device handle that can address a band of
// rows of its tensor without a copy.
type RowsViewer interface {
	// RowsView returns the handle of rows [lo, hi) of a tensor of cols columns.
	RowsView(lo, hi, cols int) any
}

// RowsView returns rows [lo, hi) of a tensor, sharing storage: a slice of
// Data on the host, a view of the device handle elsewhere (nil when the
// handle cannot address rows).
func (t *Tensor) RowsView(lo, hi int) *Tensor {
	v := &Tensor{Rows: hi - lo, Cols: t.Cols}
	if t.Data != nil {
		v.Data = t.Data[lo*t.Cols : hi*t.Cols]
	}
	if rv, ok := t.Dev.(RowsViewer); ok {
		v.Dev = rv.RowsView(lo, hi, t.Cols)
	}
	return v
}

// Truncate keeps the first rows rows of the tensor (its storage stays).
func (t *Tensor) Truncate(rows int) {
	t.Rows = rows
	if t.Data != nil {
		t.Data = t.Data[:rows*t.Cols]
	}
}

func (t *Tensor) String() string { return fmt.Sprintf("Tensor[%d,%d]", t.Rows, t.Cols) }

// Format is a weight matrix's storage format.
type Format uint8

const (
	F32 Format = iota + 1
	BF16
	F16
	MXFP4     // compressed-tensors mxfp4-pack-quantized: E2M1 nibbles, low nibble = even column, E8M0 scale per 32
	MXFP8E4M3 // OCP MX: one F8_E4M3 byte per element, E8M0 scale per 32
	MXFP8E5M2
)

func (f Format) String() string {
	switch f {
	case F32:
		return "F32"
	case BF16:
		return "BF16"
	case F16:
		return "F16"
	case MXFP4:
		return "MXFP4"
	case MXFP8E4M3:
		return "MXFP8(E4M3)"
	case MXFP8E5M2:
		return "MXFP8(E5M2)"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// MXBlock is the number of elements sharing one E8M0 scale.
const MXBlock = 32

// RowBytes is the number of data bytes of one row of Cols elements.
func (f Format) RowBytes(cols int) int {
	switch f {
	case F32:
		return 4 * cols
	case BF16, F16:
		return 2 * cols
	case MXFP4:
		return cols / 2
	case MXFP8E4M3, MXFP8E5M2:
		return cols
	}
	return 0
}

// Scaled reports whether the format carries E8M0 block scales.
func (f Format) Scaled() bool { return f == MXFP4 || f == MXFP8E4M3 || f == MXFP8E5M2 }

// Matrix is a weight [Rows, Cols] used as y = W x, in its checkpoint
// storage format. Data and Scales are views of host memory: an mmapped
// checkpoint or a weight-streamer buffer; they are never copied or
// dequantized as a whole on the CPU backend.
type Matrix struct {
	Name       string // checkpoint base name, for errors
	Rows, Cols int
	Format     Format
	Data       []byte // row-major elements (MXFP4: [Rows, Cols/2] packed)
	Scales     []byte // E8M0 [Rows, Cols/32] for MX formats
	Dev        any    // device copy, set by Backend.Bind
}

// Check verifies that the byte slices match the shape and format.
func (m *Matrix) Check() error {
	if m.Rows <= 0 || m.Cols <= 0 {
		return fmt.Errorf("weight %s: bad shape [%d, %d]", m.Name, m.Rows, m.Cols)
	}
	if want := m.Rows * m.Format.RowBytes(m.Cols); len(m.Data) != want {
		return fmt.Errorf("weight %s: %s [%d, %d] needs %d data bytes, have %d", m.Name, m.Format, m.Rows, m.Cols, want, len(m.Data))
	}
	if m.Format.Scaled() {
		if m.Cols%MXBlock != 0 {
			return fmt.Errorf("weight %s: %s needs a column count that is a multiple of %d, have %d", m.Name, m.Format, MXBlock, m.Cols)
		}
		if want := m.Rows * m.Cols / MXBlock; len(m.Scales) != want {
			return fmt.Errorf("weight %s: %s [%d, %d] needs %d scale bytes, have %d", m.Name, m.Format, m.Rows, m.Cols, want, len(m.Scales))
		}
	}
	return nil
}

// Bytes is the matrix's storage size.
func (m *Matrix) Bytes() int { return len(m.Data) + len(m.Scales) }

// LatentCache is one MLA layer's cache rows [Rows, Cols] (normalised c_kv
// then k_pe), stored as F32 or as BF16 bit patterns; exactly one is set. The
// host slices are the sequence state's own bytes; a device backend attaches
// a device copy in Dev (Memory.AttachLatent) for the ops of one layer and
// writes it back when the layer is done (Memory.DetachLatent).
type LatentCache struct {
	F32        []float32
	BF16       []uint16
	Rows, Cols int
	Dev        any
}

// Span is one sequence's rows [Lo, Hi) inside a batch tensor.
type Span struct{ Lo, Hi int }

// Len is the number of rows.
func (s Span) Len() int { return s.Hi - s.Lo }

// Backend runs the K3 ops. Methods panic only on programmer error, such as
// shape mismatches the model code guarantees; data errors are the loader's
// job. Values cross between the host and the backend only at Embed, at a
// layer's state attach and detach, at Download, and in RouterTopK's ids and
// weights, 8 bytes per routed row; docs/ARCHITECTURE.md, "Backends and
// device memory", has the contract.
type Backend interface {
	Name() string
	// Threads is the degree of parallelism the backend uses on the host.
	Threads() int
	Memory
	Ops
}

// DeviceMemory is implemented by backends whose tensors and weights live in
// memory of their own (a GPU's), which the worker plans like host memory.
type DeviceMemory interface {
	// DeviceMemory returns the device's free and total bytes.
	DeviceMemory() (free, total int64)
}

// Memory is where a backend's tensors, weights and attached state live, and
// the only ways values cross between the host and the backend.
type Memory interface {
	// AllocHost returns staging memory the weight streamer reads into:
	// page-aligned (usable with direct I/O) and, on device backends, pinned so
	// that Bind copies from it with DMA and no intermediate copy.
	AllocHost(n int) ([]byte, error)
	FreeHost(b []byte)
	// Bind makes a weight usable by ops (a no-op view on the CPU backend, an
	// upload to device memory elsewhere); Release frees the device copy.
	Bind(m *Matrix) error
	Release(m *Matrix)
	// NewTensor allocates a zeroed activation tensor; Free returns its
	// storage (a no-op on the CPU backend, where the collector does it). A
	// tensor must not be used after Free.
	NewTensor(rows, cols int) *Tensor
	Free(t *Tensor)
	// Upload and Download copy a whole tensor's values from or to the host.
	Upload(dst *Tensor, src []float32)
	Download(dst []float32, src *Tensor)
	// CopyBlock copies the block of rows×cols values at (sr, sc) of src to
	// (dr, dc) of dst. dst and src may be the same tensor with overlapping
	// blocks only when dr <= sr (squeezing rows out moves them up).
	CopyBlock(dst *Tensor, dr, dc int, src *Tensor, sr, sc, rows, cols int)

	// AttachState makes a sequence state array (host memory, the state's own
	// bytes: a KDA state or conv tail) usable by ops as a [rows, cols]
	// tensor: on the CPU the tensor shares host's memory; a device backend
	// uploads it. DetachState writes the tensor's values back into host and
	// frees the tensor; after it host holds the op's result.
	AttachState(host []float32, rows, cols int) *Tensor
	DetachState(t *Tensor, host []float32)
	// AttachLatent makes a latent cache usable by WriteLatent and
	// MLAAttention; its first valid rows hold values (the rest are about to
	// be written). DetachLatent writes rows [from, Rows) back into the host
	// slices and frees the device copy.
	AttachLatent(c *LatentCache, valid int)
	DetachLatent(c *LatentCache, from int)
}

// Ops are the model's compute ops over backend tensors.
type Ops interface {
	// Embed writes rows ids of table into dst [len(ids), table.Cols].
	Embed(dst *Tensor, table *Matrix, ids []int32)
	// MatMul computes dst[T, W.Rows] = x[T, W.Cols] · Wᵀ.
	MatMul(dst, x *Tensor, w *Matrix)
	// RMSNorm normalises each group of len(w) (or x.Cols when w is nil and
	// group is 0) consecutive values of each row: dst = w ⊙ x / sqrt(mean(x²)+eps).
	RMSNorm(dst, x *Tensor, w []float32, group int, eps float32)
	// L2NormGroups scales each group of `group` values to unit L2 norm
	// (x / sqrt(Σx² + eps)) times scale, in place.
	L2NormGroups(x *Tensor, group int, eps, scale float32)
	// Add computes dst = a + b; AddBias adds bias to every row in place.
	Add(dst, a, b *Tensor)
	AddBias(x *Tensor, bias []float32)
	// Sigmoid applies σ in place; MulSigmoid computes x ⊙ σ(gate) in place.
	Sigmoid(x *Tensor)
	MulSigmoid(x, gate *Tensor)
	// SiTUMLP computes dst = W_down · SiTU(W_gate x, W_up x) with
	// SiTU(g, u) = β1·tanh(g/β1)·σ(g)·β2·tanh(u/β2) (spec §3.5): the dense FFN
	// and the shared experts. The hidden activations stay in fp64 inside the
	// op on the CPU; only the output is rounded.
	SiTUMLP(dst, x *Tensor, gate, up, down *Matrix, beta1, beta2 float32)
	// AttnResMix writes, per row, the softmax(score)-weighted sum of the raw
	// sources, score = Σ (v/rms(v)) ⊙ proj (spec §3.2; proj = wn ⊙ wp).
	AttnResMix(dst *Tensor, sources []*Tensor, proj []float32, eps float32)

	// ShortConvSiLU is the KDA depthwise causal conv + SiLU over the rows of
	// span, continuing from and updating tail [P, K-1] (oldest first).
	ShortConvSiLU(dst, x *Tensor, span Span, w *Tensor, tail *Tensor)
	// KDAGate maps z to the per-channel log decay g = lower·σ(exp(aLog[h])·z)
	// for head h = column / headDim, in place.
	KDAGate(z *Tensor, aLog []float32, headDim int, lower float32)
	// KDA runs the gated delta rule over the rows of span for every head,
	// continuing from and updating S [H*d_k, d_v] (spec §3.3); q is already
	// normalised and scaled, g is the log decay, beta [T, H]. chunk 0 runs the
	// sequential recurrence; chunk C > 0 the chunked (UT/WY) form with tiles of C.
	KDA(o, q, k, v, g, beta *Tensor, span Span, S *Tensor, heads, dk, dv, chunk int)
	// WriteLatent writes rows [srcRow, srcRow+n) of src (cache.Cols wide)
	// into cache rows [row, row+n), rounded to the cache's dtype (BF16:
	// round to nearest even).
	WriteLatent(cache *LatentCache, row int, src *Tensor, srcRow, n int)
	// MLAAttention attends the rows of span, which are the last span.Len()
	// rows of cache (already written), over the cache with a causal mask
	// (spec §3.4). q [T, H*(nope+rope)]; kvb = kv_b_proj [H*(nope+v), kvLora];
	// o [T, H*v]. absorb selects the weight-absorbed form (attention over the
	// latent rows directly, for decode steps) instead of expanding K and V
	// (for prefill); the two are equal in exact arithmetic.
	MLAAttention(o, q *Tensor, span Span, cache *LatentCache, kvb *Matrix, heads, nope, rope, vdim int, scale float32, absorb bool)
	// RouterTopK selects top-k experts per row by σ(logit)+bias and returns
	// their ids and weights σ(logit)/Σ (renormalised when renorm) × scale
	// into host slices [T*k].
	RouterTopK(logits *Tensor, bias []float32, k int, renorm bool, scale float32, ids []int32, weights []float32)
	// RoutedExperts computes, for every row r of z, the mixture
	// u[r] = Σ_j weights[r*k+j] · w2·SiTU(w1 z[r], w3 z[r]) of the experts
	// ids[r*k+j], summed in j order (so a row's result does not depend on the
	// rest of the batch). Experts run over all their rows at once.
	RoutedExperts(u, z *Tensor, ids []int32, weights []float32, k int, experts []Expert, beta1, beta2 float32)
}

// Expert is one routed expert's SiTU-GLU: w1 (gate), w3 (up), w2 (down).
type Expert struct{ W1, W3, W2 *Matrix }

// NewF32Matrix wraps fp32 values [rows, cols] as an F32 weight (copying
// them into little-endian bytes).
func NewF32Matrix(name string, rows, cols int, data []float32) *Matrix {
	b := make([]byte, 4*len(data))
	for i, v := range data {
		u := math.Float32bits(v)
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return &Matrix{Name: name, Rows: rows, Cols: cols, Format: F32, Data: b}
}

// DeviceError is what a device backend panics with when the device itself
// fails under an op (out of memory, a launch or copy the driver refused):
// ops have no error result, so the caller that owns a pass recovers this one
// type with CatchDevice and fails that pass's jobs with it. Every other
// panic is a programmer error and is not recovered.
type DeviceError struct{ Err error }

func (e *DeviceError) Error() string { return "device: " + e.Err.Error() }
func (e *DeviceError) Unwrap() error { return e.Err }

// CatchDevice, deferred, turns a DeviceError panic into *err and lets any
// other panic go on.
func CatchDevice(err *error) {
	p := recover()
	if p == nil {
		return
	}
	de, ok := p.(*DeviceError)
	if !ok {
		panic(p)
	}
	*err = de
}
