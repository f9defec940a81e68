package kvtransfer

import (
	"fmt"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tandem-inference/tandem/internal/msgpackscan"
	"github.com/tandem-inference/tandem/model"
)

// ProtocolVersion is the version carried in CHALLENGE and HELLO frames.
const ProtocolVersion = 1

// frameType is the "t" field of every frame header.
type frameType uint8

const (
	frameChallenge frameType = 1  // server -> client: version, fresh nonce
	frameHello     frameType = 2  // client -> server: version, kind, session, client nonce, proof
	frameWelcome   frameType = 3  // server -> client: server proof, chunk size, window, done chunks
	frameData      frameType = 4  // client -> server: one chunk of one part + payload
	frameAck       frameType = 5  // server -> client: cumulative seq, bad and busy seqs
	frameEnd       frameType = 6  // client -> server: totals; no more new chunks
	frameCommit    frameType = 7  // server -> client: the state is committed
	framePing      frameType = 8  // keep-alive
	framePong      frameType = 9  // keep-alive answer
	frameAbort     frameType = 10 // client -> server: sender gave up, with reason
	frameError     frameType = 11 // either way: fatal refusal, with code and reason
	frameMsg       frameType = 12 // channel message: user header in "m" + payload
)

func (t frameType) String() string {
	names := [...]string{"", "CHALLENGE", "HELLO", "WELCOME", "DATA", "ACK", "END", "COMMIT", "PING", "PONG", "ABORT", "ERROR", "MSG"}
	if int(t) < len(names) && t != 0 {
		return names[t]
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

// connKind says what a HELLO opens.
type connKind uint8

const (
	kindTransfer connKind = 1
	kindChannel  connKind = 2
)

// header is the msgpack header of every frame. One struct serves all frame
// types (unused fields are omitted on the wire), so a frame is decoded once.
type header struct {
	Type frameType `msgpack:"t"`

	// CHALLENGE, HELLO, WELCOME.
	Version int      `msgpack:"v,omitempty"`
	Kind    connKind `msgpack:"k,omitempty"`
	Session string   `msgpack:"sid,omitempty"`
	Nonce   []byte   `msgpack:"n,omitempty"`
	Proof   []byte   `msgpack:"p,omitempty"`

	// WELCOME: the receiver's chunk grid and credit window, what it already
	// holds (for resume), and whether it has seen END or committed.
	Chunk     int        `msgpack:"cs,omitempty"`
	Window    int        `msgpack:"w,omitempty"`
	Done      []partBits `msgpack:"done,omitempty"`
	Ended     bool       `msgpack:"ended,omitempty"`
	Committed bool       `msgpack:"com,omitempty"`

	// DATA (and ACK's cumulative Seq).
	Seq   uint64         `msgpack:"s,omitempty"`
	Layer int            `msgpack:"l,omitempty"`
	Part  model.PartKind `msgpack:"pk,omitempty"`
	DType model.DType    `msgpack:"dt,omitempty"`
	Shape []int          `msgpack:"sh,omitempty"`
	Off   int64          `msgpack:"o,omitempty"`
	Len   int64          `msgpack:"len,omitempty"`
	CRC   uint32         `msgpack:"crc,omitempty"`

	// ACK: sequence numbers whose chunk failed its checksum (resend now) or
	// was being received on another connection (resend later).
	Bad  []uint64 `msgpack:"bad,omitempty"`
	Busy []uint64 `msgpack:"busy,omitempty"`

	// END totals for this receiver, and the layers it was sent.
	Sent   []int `msgpack:"sent,omitempty"`
	Tokens int   `msgpack:"tok,omitempty"`
	// An append's base: the tokens the receiver already holds and the
	// prefix-key link that names them (see SenderConfig.Base).
	Base    int    `msgpack:"bt,omitempty"`
	BaseKey uint64 `msgpack:"bk,omitempty"`
	Layers  int    `msgpack:"nl,omitempty"`
	Parts   int    `msgpack:"np,omitempty"`
	Bytes   int64  `msgpack:"nb,omitempty"`

	// ERROR and ABORT.
	Code string `msgpack:"code,omitempty"`
	Msg  string `msgpack:"msg,omitempty"`

	// MSG: the channel user's own msgpack header.
	Meta msgpack.RawMessage `msgpack:"m,omitempty"`
}

// partBits lists the chunks of one part a receiver holds verified, as a
// bitmap over the chunk grid (bit i of byte i/8 is chunk i).
type partBits struct {
	Layer int            `msgpack:"l"`
	Part  model.PartKind `msgpack:"pk"`
	Bits  []byte         `msgpack:"b"`
}

func encodeHeader(h *header) ([]byte, error) {
	b, err := msgpack.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode %s header: %w", h.Type, err)
	}
	return b, nil
}

var headerType = reflect.TypeFor[header]()

func decodeHeader(b []byte, h *header) error {
	*h = header{}
	if err := msgpackscan.CheckFor(b, headerType); err != nil {
		return fmt.Errorf("%w: frame header: %v", ErrProtocol, err)
	}
	if err := msgpack.Unmarshal(b, h); err != nil {
		return fmt.Errorf("%w: undecodable frame header: %v", ErrProtocol, err)
	}
	if h.Type == 0 {
		return fmt.Errorf("%w: frame header without a type", ErrProtocol)
	}
	return nil
}

// Limits on what a peer may make us allocate or read.
const (
	// MaxHeader bounds a frame header. A WELCOME's done bitmaps are the
	// largest header: 64 KiB covers half a million chunks.
	MaxHeader = 64 << 10
	// DefaultChunkSize is the receiver's default chunk grid.
	DefaultChunkSize = 1 << 20
	// MaxChunkSize bounds a chunk (and so a DATA frame's payload).
	MaxChunkSize = 16 << 20
	// DefaultWindow is the default credit window: chunks a sender may have
	// unacknowledged on one connection. 32 matches the posted receive
	// requests an RDMA queue pair can hold.
	DefaultWindow = 32
	maxWindow     = 1024
	maxShapeRank  = 4
	maxSessionID  = 256
	minSecret     = 16
)
