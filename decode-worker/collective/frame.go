package collective

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// A frame is a fixed header and a payload of count elements, each float32
// or float64 little-endian:
//
//	0:4   magic "tAR1"
//	4:12  sequence number of the call
//	12:14 sending rank
//	14    pass (passDirect, passReduce, passBcast)
//	15    element size in bytes (4 or 8)
//	16:20 chunk index
//	20:24 element count
const headerLen = 24

var magic = [4]byte{'t', 'A', 'R', '1'}

const (
	passDirect uint8 = iota + 1
	passReduce
	passBcast
)

func passName(p uint8) string {
	switch p {
	case passDirect:
		return "direct"
	case passReduce:
		return "reduce"
	case passBcast:
		return "broadcast"
	}
	return fmt.Sprintf("pass %d", p)
}

// header is a frame's header.
type header struct {
	seq   uint64
	from  int
	pass  uint8
	size  uint8
	chunk uint32
	count uint32
}

func (h *header) put(b []byte) {
	copy(b[0:4], magic[:])
	binary.LittleEndian.PutUint64(b[4:12], h.seq)
	binary.LittleEndian.PutUint16(b[12:14], uint16(h.from))
	b[14] = h.pass
	b[15] = h.size
	binary.LittleEndian.PutUint32(b[16:20], h.chunk)
	binary.LittleEndian.PutUint32(b[20:24], h.count)
}

// check parses frame's header and checks it, and the frame's length, against
// want. It returns the payload.
func check(frame []byte, want *header) ([]byte, error) {
	if len(frame) < headerLen {
		return nil, fmt.Errorf("frame of %d bytes, shorter than its header", len(frame))
	}
	if [4]byte(frame[0:4]) != magic {
		return nil, fmt.Errorf("frame without the collective's magic (%x)", frame[0:4])
	}
	got := header{
		seq:   binary.LittleEndian.Uint64(frame[4:12]),
		from:  int(binary.LittleEndian.Uint16(frame[12:14])),
		pass:  frame[14],
		size:  frame[15],
		chunk: binary.LittleEndian.Uint32(frame[16:20]),
		count: binary.LittleEndian.Uint32(frame[20:24]),
	}
	switch {
	case got.seq < want.seq:
		return nil, fmt.Errorf("stale frame of call %d during call %d (a late or duplicated frame)", got.seq, want.seq)
	case got.seq > want.seq:
		return nil, fmt.Errorf("frame of call %d during call %d (the peer is ahead)", got.seq, want.seq)
	case got.from != want.from:
		return nil, fmt.Errorf("frame from rank %d on rank %d's link", got.from, want.from)
	case got.pass != want.pass || got.chunk != want.chunk:
		return nil, fmt.Errorf("%s frame of chunk %d, expected %s chunk %d", passName(got.pass), got.chunk, passName(want.pass), want.chunk)
	case got.size != want.size || got.count != want.count:
		return nil, fmt.Errorf("frame of %d %d-byte values, expected %d %d-byte values (do the ranks' buffers have the same length?)", got.count, got.size, want.count, want.size)
	case len(frame)-headerLen != int(want.count)*int(want.size):
		return nil, fmt.Errorf("frame of %d payload bytes, its header says %d", len(frame)-headerLen, int(want.count)*int(want.size))
	}
	return frame[headerLen:], nil
}

// littleEndian says the host stores numbers as the wire does, so values are
// copied as they lie in memory.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func putF32(dst []byte, src []float32) {
	if len(src) == 0 {
		return
	}
	if littleEndian {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src)))
		return
	}
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

func getF32(dst []float32, src []byte) {
	if len(dst) == 0 {
		return
	}
	if littleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func putF64(dst []byte, src []float64) {
	if len(src) == 0 {
		return
	}
	if littleEndian {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 8*len(src)))
		return
	}
	for i, v := range src {
		binary.LittleEndian.PutUint64(dst[8*i:], math.Float64bits(v))
	}
}

func getF64(dst []float64, src []byte) {
	if len(dst) == 0 {
		return
	}
	if littleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 8*len(dst)), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:]))
	}
}

// viewF32 returns payload's n float32 values: payload itself where the host
// is little-endian and payload is aligned for float32, else a copy in
// scratch (grown to n).
func viewF32(scratch []float32, payload []byte, n int) []float32 {
	if n == 0 {
		return scratch[:0]
	}
	if littleEndian && uintptr(unsafe.Pointer(&payload[0]))%unsafe.Alignof(float32(0)) == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&payload[0])), n)
	}
	scratch = grow(scratch, n)
	getF32(scratch, payload)
	return scratch
}
