package rdma

import (
	"encoding/binary"

	"github.com/tandem-inference/tandem/internal/crc32c"
)

// A slot is one SEND/RECV buffer of the link. It starts with this 64-byte
// header, all little-endian:
//
//	 0 u32 magic "TDRL"
//	 4 u32 epoch of the sending side of the link
//	 8 u64 seq: link sequence number (0 for an unsequenced control slot)
//	16 u64 ack: the sender's cumulative ack (every seq up to it arrived)
//	24 u64 credit: the highest seq the sender of this slot can take now
//	32 u32 stream id
//	36 u8  kind, 37 u8 flags, 38 u16 probe: a probe's number, echoed by
//	       its answer (zero otherwise)
//	40 u32 data: bytes at the start of the payload continuing a frame
//	       begun in an earlier slot of the stream
//	44 u32 data: frames that start in this slot (each with its prefix)
//	48 u32 length of the payload in this slot
//	52 u32 CRC-32C of the payload
//	56 u32 CRC-32C of bytes 0..56
//	60 u32 zero
const (
	hdrSize  = 64
	magic    = 0x4c524454 // "TDRL"
	hcrcAt   = 56
	pcrcAt   = 52
	minSlot  = 8 << 10
	maxSlot  = 4 << 20
	maxSlots = 1024
)

type kind uint8

const (
	kindData  kind = 1 // a fragment of a frame of a stream
	kindOpen  kind = 2 // a stream opens (dialer to listener)
	kindClose kind = 3 // a stream closes
	kindCtl   kind = 4 // unsequenced: ack and credit only
)

const (
	flagNak        = 1 // the receiver saw a gap: resend from ack+1 now
	flagProbe      = 2 // the sender's timer expired: answer with flagProbeReply now
	flagProbeReply = 4 // the answer: everything sent before the probe and not covered by ack is lost
)

type slotHeader struct {
	epoch       uint32
	seq         uint64
	ack, credit uint64
	stream      uint32
	kind        kind
	flags       uint8
	probe       uint16 // flagProbe: its number; flagProbeReply: the number answered
	frag, nfrag uint32 // data: continuation bytes at the start, frames starting here
	n           uint32
	pcrc        uint32
}

// put writes h into b and seals it with the header checksum.
func (h *slotHeader) put(b []byte) {
	_ = b[hdrSize-1]
	le := binary.LittleEndian
	le.PutUint32(b[0:], magic)
	le.PutUint32(b[4:], h.epoch)
	le.PutUint64(b[8:], h.seq)
	le.PutUint64(b[16:], h.ack)
	le.PutUint64(b[24:], h.credit)
	le.PutUint32(b[32:], h.stream)
	b[36], b[37] = byte(h.kind), h.flags
	le.PutUint16(b[38:], h.probe)
	le.PutUint32(b[40:], h.frag)
	le.PutUint32(b[44:], h.nfrag)
	le.PutUint32(b[48:], h.n)
	le.PutUint32(b[pcrcAt:], h.pcrc)
	le.PutUint32(b[hcrcAt:], crc32c.Checksum(b[:hcrcAt]))
	le.PutUint32(b[60:], 0)
}

// refresh rewrites the piggybacked ack and credit of a sealed header.
func refresh(b []byte, ack, credit uint64) {
	le := binary.LittleEndian
	le.PutUint64(b[16:], ack)
	le.PutUint64(b[24:], credit)
	le.PutUint32(b[hcrcAt:], crc32c.Checksum(b[:hcrcAt]))
}

// parse checks a received slot's header and payload; ok is false for
// anything damaged, which the link then treats as a lost slot.
func parse(b []byte, maxPayload int) (h slotHeader, ok bool) {
	if len(b) < hdrSize {
		return h, false
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != magic || le.Uint32(b[hcrcAt:]) != crc32c.Checksum(b[:hcrcAt]) {
		return h, false
	}
	h = slotHeader{epoch: le.Uint32(b[4:]), seq: le.Uint64(b[8:]), ack: le.Uint64(b[16:]), credit: le.Uint64(b[24:]),
		stream: le.Uint32(b[32:]), kind: kind(b[36]), flags: b[37], probe: le.Uint16(b[38:]), frag: le.Uint32(b[40:]), nfrag: le.Uint32(b[44:]),
		n: le.Uint32(b[48:]), pcrc: le.Uint32(b[pcrcAt:])}
	if int(h.n) > maxPayload || int(h.n) > len(b)-hdrSize || h.kind < kindData || h.kind > kindCtl {
		return h, false
	}
	if h.n > 0 && crc32c.Checksum(b[hdrSize:hdrSize+int(h.n)]) != h.pcrc {
		return h, false
	}
	return h, true
}
