package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"strings"
	"unsafe"
)

// DType is the element type of a state part (and of checkpoint tensors).
type DType uint8

const (
	F32  DType = 1
	BF16 DType = 2
)

func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case BF16:
		return "BF16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// ParseCacheDType reads an MLA cache dtype as written in configs and flags:
// "bf16" (the state contract) or "f32" (exact, for checks).
func ParseCacheDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "bf16":
		return BF16, nil
	case "f32":
		return F32, nil
	}
	return 0, fmt.Errorf("cache dtype %q: want bf16 or f32", s)
}

// Size is the element size in bytes.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case BF16:
		return 2
	}
	return 0
}

// PartKind names one piece of a layer's decode state (the state contract of
// docs/ARCHITECTURE.md and spec §4).
type PartKind uint8

const (
	PartLatent   PartKind = 1 // MLA cache rows [T, kv_lora+rope]: normalised c_kv then raw k_pe
	PartKDAState PartKind = 2 // KDA recurrent state S [H, d_k, d_v] fp32, rows = key channels
	PartConvQ    PartKind = 3 // KDA short-conv tail of q: [P, K-1] pre-conv projected inputs, oldest first
	PartConvK    PartKind = 4
	PartConvV    PartKind = 5
)

func (k PartKind) String() string {
	switch k {
	case PartLatent:
		return "mla_latent"
	case PartKDAState:
		return "kda_state"
	case PartConvQ:
		return "conv_q"
	case PartConvK:
		return "conv_k"
	case PartConvV:
		return "conv_v"
	}
	return fmt.Sprintf("PartKind(%d)", uint8(k))
}

// Part is one piece of a layer's state: a dense row-major array of DType
// elements with the given shape. Data is the wire form and the in-memory form
// at once, so that a transfer receiver can write straight into it.
type Part struct {
	Kind  PartKind
	DType DType
	Shape []int
	Data  []byte
}

// Elems is the number of elements the shape holds.
func (p *Part) Elems() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// F32 views an F32 part's bytes as float32s (all supported targets are
// little-endian, checked in init).
func (p *Part) F32() []float32 {
	if p.DType != F32 || len(p.Data) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&p.Data[0])), len(p.Data)/4)
}

// U16 views a BF16 part's bytes as raw bfloat16 bit patterns.
func (p *Part) U16() []uint16 {
	if p.DType != BF16 || len(p.Data) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&p.Data[0])), len(p.Data)/2)
}

// LayerState is the decode state one layer carries between tokens. MLA layers
// have one part (the latent cache); KDA layers have four (S and three conv
// tails). Dense/MoE and AttnRes carry nothing across tokens.
type LayerState struct {
	Layer int
	Kind  LayerKind
	Parts []Part
}

// Part returns the part of the given kind, or nil.
func (ls *LayerState) Part(k PartKind) *Part {
	for i := range ls.Parts {
		if ls.Parts[i].Kind == k {
			return &ls.Parts[i]
		}
	}
	return nil
}

// Bytes is the state's payload size.
func (ls *LayerState) Bytes() int {
	n := 0
	for i := range ls.Parts {
		n += len(ls.Parts[i].Data)
	}
	return n
}

// SeqState is one sequence's decode state: Tokens consumed so far and, for
// each layer this holder owns, its LayerState (nil for layers owned
// elsewhere, e.g. by another decode rank).
type SeqState struct {
	Tokens int
	Layers []*LayerState

	// verify is an uncommitted verify step (verify.go); it is never
	// cloned, encoded or sent.
	verify *verifyPending
}

// StateOptions choose the storage of the state.
type StateOptions struct {
	// LatentDType is the MLA cache element type: BF16 (the state contract) or
	// F32 (exact, for fixture checks). Attention always reads the stored
	// (rounded) rows, so every path sees the same cache.
	LatentDType DType
	// LatentCapacity preallocates room for this many cached tokens per MLA
	// layer; appends beyond it grow the buffer.
	LatentCapacity int
	// Shard holds, for a tensor-parallel rank, only its KDA heads' state
	// and conv tails (the zero Shard: every head).
	Shard Shard
}

// NewSeqState allocates an empty state for layers [lo, hi).
func (c *Config) NewSeqState(lo, hi int, opt StateOptions) *SeqState {
	if opt.LatentDType == 0 {
		opt.LatentDType = BF16
	}
	s := &SeqState{Layers: make([]*LayerState, c.NumLayers)}
	for L := lo; L < hi; L++ {
		s.Layers[L] = c.NewLayerState(L, opt)
	}
	return s
}

// NewLayerState allocates layer L's empty state.
func (c *Config) NewLayerState(L int, opt StateOptions) *LayerState {
	if opt.LatentDType == 0 {
		opt.LatentDType = BF16
	}
	ls := &LayerState{Layer: L, Kind: c.LayerKind(L)}
	switch ls.Kind {
	case MLA:
		w := c.LatentWidth()
		ls.Parts = []Part{{Kind: PartLatent, DType: opt.LatentDType, Shape: []int{0, w},
			Data: make([]byte, 0, opt.LatentCapacity*w*opt.LatentDType.Size())}}
	case KDA:
		H, D, K1 := c.KDAHeads/max(opt.Shard.Ranks, 1), c.KDAHeadDim, c.ConvKernel-1
		P := H * D
		ls.Parts = []Part{
			{Kind: PartKDAState, DType: F32, Shape: []int{H, D, D}, Data: make([]byte, H*D*D*4)},
			{Kind: PartConvQ, DType: F32, Shape: []int{P, K1}, Data: make([]byte, P*K1*4)},
			{Kind: PartConvK, DType: F32, Shape: []int{P, K1}, Data: make([]byte, P*K1*4)},
			{Kind: PartConvV, DType: F32, Shape: []int{P, K1}, Data: make([]byte, P*K1*4)},
		}
	}
	return ls
}

// ExpectedParts lists the parts (kind, dtype, shape) a receiver must get for
// layer L of a sequence of T cached tokens. It is what a transfer receiver
// preallocates and verifies against, so that a peer cannot choose shapes.
func (c *Config) ExpectedParts(L, T int, latent DType) []Part {
	return c.ExpectedShardParts(L, T, latent, Shard{})
}

// ExpectedShardParts is ExpectedParts for tensor rank s, which holds the
// KDA state and conv tails of its heads only (the MLA cache whole).
func (c *Config) ExpectedShardParts(L, T int, latent DType, s Shard) []Part {
	switch c.LayerKind(L) {
	case MLA:
		return []Part{{Kind: PartLatent, DType: latent, Shape: []int{T, c.LatentWidth()}}}
	case KDA:
		H, D, K1 := c.KDAHeads/max(s.Ranks, 1), c.KDAHeadDim, c.ConvKernel-1
		P := H * D
		return []Part{
			{Kind: PartKDAState, DType: F32, Shape: []int{H, D, D}},
			{Kind: PartConvQ, DType: F32, Shape: []int{P, K1}},
			{Kind: PartConvK, DType: F32, Shape: []int{P, K1}},
			{Kind: PartConvV, DType: F32, Shape: []int{P, K1}},
		}
	}
	return nil
}

// CheckLayerState checks layer L's state of a sequence of T cached tokens:
// its label, exactly the ExpectedParts (kinds, dtypes, shapes, byte
// counts), and every value finite. Whoever takes over a state checks it
// so: a decode rank before decoding, a prefill sink before passing it on.
func (c *Config) CheckLayerState(ls *LayerState, L, T int, latent DType) error {
	return c.CheckShardLayerState(ls, L, T, latent, Shard{})
}

// CheckShardLayerState is CheckLayerState for tensor rank s's slice.
func (c *Config) CheckShardLayerState(ls *LayerState, L, T int, latent DType, s Shard) error {
	if ls.Layer != L || ls.Kind != c.LayerKind(L) {
		return fmt.Errorf("state: layer %d is labelled layer %d (%s), expected %s", L, ls.Layer, ls.Kind, c.LayerKind(L))
	}
	want := c.ExpectedShardParts(L, T, latent, s)
	if len(ls.Parts) != len(want) {
		return fmt.Errorf("state: layer %d has %d parts, expected %d", L, len(ls.Parts), len(want))
	}
	for i := range want {
		w, p := &want[i], &ls.Parts[i]
		if p.Kind != w.Kind || p.DType != w.DType || !slices.Equal(p.Shape, w.Shape) {
			return fmt.Errorf("state: layer %d part %d is %s %s %v, expected %s %s %v", L, i, p.Kind, p.DType, p.Shape, w.Kind, w.DType, w.Shape)
		}
		if n := w.Elems() * w.DType.Size(); len(p.Data) != n {
			return fmt.Errorf("state: layer %d part %s has %d bytes, expected %d", L, p.Kind, len(p.Data), n)
		}
		if i, v, ok := nonFinite(p); ok {
			return fmt.Errorf("state: layer %d part %s element %d is %v", L, p.Kind, i, v)
		}
	}
	return nil
}

// nonFinite finds the first NaN or infinite element of a part.
func nonFinite(p *Part) (int, float64, bool) {
	switch p.DType {
	case F32:
		for i, x := range p.F32() {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return i, float64(x), true
			}
		}
	case BF16:
		for i, u := range p.U16() {
			if u&0x7f80 == 0x7f80 { // all exponent bits set: Inf or NaN
				return i, float64(math.Float32frombits(uint32(u) << 16)), true
			}
		}
	}
	return 0, 0, false
}

// Clone deep-copies the layer state.
func (ls *LayerState) Clone() *LayerState {
	out := &LayerState{Layer: ls.Layer, Kind: ls.Kind, Parts: make([]Part, len(ls.Parts))}
	for i, p := range ls.Parts {
		out.Parts[i] = Part{Kind: p.Kind, DType: p.DType, Shape: append([]int(nil), p.Shape...),
			Data: append(make([]byte, 0, cap(p.Data)), p.Data...)}
	}
	return out
}

// Clone deep-copies the sequence state.
func (s *SeqState) Clone() *SeqState {
	out := &SeqState{Tokens: s.Tokens, Layers: make([]*LayerState, len(s.Layers))}
	for i, ls := range s.Layers {
		if ls != nil {
			out.Layers[i] = ls.Clone()
		}
	}
	return out
}

// Bytes is the payload size of all held layers.
func (s *SeqState) Bytes() int {
	n := 0
	for _, ls := range s.Layers {
		if ls != nil {
			n += ls.Bytes()
		}
	}
	return n
}

// Binary encoding of a SeqState (little-endian), byte-exact and stable:
//
//	magic "K3ST" | u16 version | u32 numLayers | u64 tokens | u32 heldLayers
//	per held layer: u32 layer | u8 kind | u32 nparts
//	  per part: u8 kind | u8 dtype | u8 rank | rank x u64 dims | u64 nbytes | bytes
//	u32 CRC-32C of everything before it
const (
	stateMagic   = "K3ST"
	stateVersion = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MarshalBinary encodes the state.
func (s *SeqState) MarshalBinary() ([]byte, error) {
	if s.verify != nil {
		return nil, fmt.Errorf("model: state has an uncommitted verify step of %d rows (commit it first)", s.verify.rows)
	}
	held := 0
	size := 4 + 2 + 4 + 8 + 4 + 4
	for _, ls := range s.Layers {
		if ls == nil {
			continue
		}
		held++
		size += 4 + 1 + 4
		for _, p := range ls.Parts {
			size += 3 + 8*len(p.Shape) + 8 + len(p.Data)
		}
	}
	b := make([]byte, 0, size)
	b = append(b, stateMagic...)
	b = binary.LittleEndian.AppendUint16(b, stateVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.Layers)))
	b = binary.LittleEndian.AppendUint64(b, uint64(s.Tokens))
	b = binary.LittleEndian.AppendUint32(b, uint32(held))
	for _, ls := range s.Layers {
		if ls == nil {
			continue
		}
		var err error
		if b, err = AppendLayerState(b, ls); err != nil {
			return nil, err
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// AppendLayerState appends one layer's record of the encoding (layer,
// kind, parts) to b: what MarshalBinary writes per held layer, and what a
// writer that streams a state layer by layer (the prefill worker's prefix
// store) writes.
func AppendLayerState(b []byte, ls *LayerState) ([]byte, error) {
	b = binary.LittleEndian.AppendUint32(b, uint32(ls.Layer))
	b = append(b, byte(ls.Kind))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ls.Parts)))
	for _, p := range ls.Parts {
		if p.Elems()*p.DType.Size() != len(p.Data) {
			return nil, fmt.Errorf("layer %d part %s: shape %v x %s is %d bytes, data has %d", ls.Layer, p.Kind, p.Shape, p.DType, p.Elems()*p.DType.Size(), len(p.Data))
		}
		b = append(b, byte(p.Kind), byte(p.DType), byte(len(p.Shape)))
		for _, d := range p.Shape {
			b = binary.LittleEndian.AppendUint64(b, uint64(d))
		}
		b = binary.LittleEndian.AppendUint64(b, uint64(len(p.Data)))
		b = append(b, p.Data...)
	}
	return b, nil
}

// ReadLayerState decodes one layer record (AppendLayerState's) from the
// front of b, for a model of nl layers, and returns the rest of b. Sizes
// are checked against what b holds before anything is allocated.
func ReadLayerState(b []byte, nl int) (*LayerState, []byte, error) {
	r := reader{b: b}
	ls, err := r.layer(nl)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrBadState, err)
	}
	return ls, r.b, nil
}

// layer reads one layer record.
func (r *reader) layer(nl int) (*LayerState, error) {
	L := int(r.u32())
	kind := LayerKind(r.u8())
	np := int(r.u32())
	if r.err != nil {
		return nil, r.err
	}
	if L >= nl {
		return nil, fmt.Errorf("layer %d out of range", L)
	}
	if kind != KDA && kind != MLA || np > 8 {
		return nil, fmt.Errorf("layer %d: kind %d with %d parts", L, kind, np)
	}
	ls := &LayerState{Layer: L, Kind: kind, Parts: make([]Part, np)}
	for j := 0; j < np && r.err == nil; j++ {
		p := &ls.Parts[j]
		p.Kind, p.DType = PartKind(r.u8()), DType(r.u8())
		rank := int(r.u8())
		if p.DType.Size() == 0 || rank > 4 {
			return nil, fmt.Errorf("layer %d part %d: dtype %d rank %d", L, j, p.DType, rank)
		}
		p.Shape = make([]int, rank)
		elems := uint64(1)
		for k := range p.Shape {
			d := r.u64()
			if d > 1<<32 {
				return nil, fmt.Errorf("layer %d part %s: dimension %d too large", L, p.Kind, d)
			}
			p.Shape[k] = int(d)
			elems *= d
			if elems > 1<<40 {
				return nil, fmt.Errorf("layer %d part %s: shape too large", L, p.Kind)
			}
		}
		n := r.u64()
		if n != elems*uint64(p.DType.Size()) {
			return nil, fmt.Errorf("layer %d part %s: %d bytes for shape %v of %s", L, p.Kind, n, p.Shape, p.DType)
		}
		if n > uint64(len(r.b)) {
			r.err = fmt.Errorf("truncated: need %d bytes, %d left", n, len(r.b))
			break
		}
		p.Data = append([]byte(nil), r.bytes(int(n))...)
	}
	if r.err != nil {
		return nil, r.err
	}
	return ls, nil
}

// ErrBadState is wrapped by every decoding error.
var ErrBadState = errors.New("bad sequence state encoding")

// UnmarshalBinary decodes a state written by MarshalBinary, refusing any
// inconsistency (checksum, sizes, kinds) rather than returning partial state.
func (s *SeqState) UnmarshalBinary(b []byte) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadState, fmt.Sprintf(format, args...))
	}
	if len(b) < 4+2+4+8+4+4 || string(b[:4]) != stateMagic {
		return bad("missing %q header", stateMagic)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return bad("checksum mismatch")
	}
	r := reader{b: body[4:]}
	if v := r.u16(); v != stateVersion {
		return bad("version %d, want %d", v, stateVersion)
	}
	nl := int(r.u32())
	tokens := r.u64()
	held := int(r.u32())
	if nl > 1<<16 || held > nl || tokens > math.MaxInt32 {
		return bad("implausible header: %d layers, %d held, %d tokens", nl, held, tokens)
	}
	out := SeqState{Tokens: int(tokens), Layers: make([]*LayerState, nl)}
	for i := 0; i < held && r.err == nil; i++ {
		ls, err := r.layer(nl)
		if err != nil {
			return bad("%v", err)
		}
		if out.Layers[ls.Layer] != nil {
			return bad("layer %d repeated", ls.Layer)
		}
		out.Layers[ls.Layer] = ls
	}
	if r.err != nil {
		return bad("%v", r.err)
	}
	if len(r.b) != 0 {
		return bad("%d trailing bytes", len(r.b))
	}
	*s = out
	return nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("truncated: need %d bytes, %d left", n, len(r.b))
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}
func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}
func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}
func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}
func (r *reader) bytes(n int) []byte { return r.take(n) }

func init() {
	// Parts are viewed in place as little-endian float32/uint16.
	x := uint16(1)
	if *(*byte)(unsafe.Pointer(&x)) != 1 {
		panic("tandem: big-endian hosts are not supported")
	}
}
