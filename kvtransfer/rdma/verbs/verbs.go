// Package verbs is the slice of the RDMA verbs API that tandem's RDMA link
// uses: devices, ports and GIDs, protection domains, completion queues,
// unreliable-connected (UC) queue pairs, memory regions and SEND/RECV.
//
// Two implementations satisfy its interfaces: the system library, bound at
// run time without cgo (System: libibverbs.so.1 on Linux, librdma.dylib on
// macOS, Apple's Thunderbolt 5 RDMA), and an in-process fake with UC
// semantics for tests (package fakeverbs).
//
// The interfaces keep to what Apple's stack offers: UC queue pairs only (no
// RC, UD or SRQ), SEND and RECV, one scatter-gather entry per request, no
// inline data.
package verbs

import (
	"errors"
	"fmt"
	"net"
)

// Provider is a verbs implementation.
type Provider interface {
	// Devices lists the RDMA devices by name ("rdma_en3", "mlx5_0").
	Devices() ([]string, error)
	// Open opens a device.
	Open(name string) (Context, error)
}

// Context is an open device.
type Context interface {
	Name() string
	// QueryPort reports port (1-based) of the device.
	QueryPort(port int) (PortAttr, error)
	// QueryGID reads entry index of port's GID table.
	QueryGID(port, index int) (GID, error)
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue of at least entries entries.
	CreateCQ(entries int) (CQ, error)
	Close() error
}

// PD is a protection domain.
type PD interface {
	// RegMR registers buf, which must stay mapped (and must not move) until
	// the region is closed: use memory outside the Go heap.
	RegMR(buf []byte, access Access) (MR, error)
	// CreateQP creates a UC queue pair in the RESET state.
	CreateQP(attr QPInit) (QP, error)
	Close() error
}

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	// Buf is the registered memory.
	Buf() []byte
	Close() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wc) completions into wc and returns how many. An
	// error means the queue itself failed (an overrun): the queue pairs
	// using it are unusable.
	Poll(wc []WC) (int, error)
	Close() error
}

// Notifier is implemented by completion queues that can wake a waiting
// poller instead of having it spin: the channel receives a value after new
// completions arrive.
type Notifier interface {
	Notify() <-chan struct{}
}

// QP is a UC queue pair.
type QP interface {
	// Num is the queue pair number the peer addresses.
	Num() uint32
	// Init moves the queue pair from RESET to INIT on port.
	Init(port int) error
	// ReadyToReceive moves it from INIT to RTR, connected to the peer.
	ReadyToReceive(a RTR) error
	// ReadyToSend moves it from RTR to RTS with the local packet sequence
	// number psn.
	ReadyToSend(psn uint32) error
	// PostSend posts a signaled SEND of buf, which must lie in mr.
	PostSend(id uint64, mr MR, buf []byte) error
	// PostRecv posts a receive into buf, which must lie in mr.
	PostRecv(id uint64, mr MR, buf []byte) error
	// Close destroys the queue pair (never via the ERR state: on Apple's
	// stack that unmaps the regions first).
	Close() error
}

// QPInit are the attributes of a new queue pair.
type QPInit struct {
	SendCQ, RecvCQ CQ
	// MaxSendWR and MaxRecvWR bound the posted requests. On Apple's stack
	// they count 4 KiB frames, not requests.
	MaxSendWR, MaxRecvWR int
}

// RTR addresses the remote queue pair.
type RTR struct {
	Port      int
	MTU       MTU
	DestQPN   uint32
	RemotePSN uint32
	DGID      GID
	SGIDIndex int
}

// Access are memory region access flags (ibv_access_flags).
type Access uint32

const (
	AccessLocalWrite  Access = 1
	AccessRemoteWrite Access = 2
	AccessRemoteRead  Access = 4
)

// AccessDefault is what Apple's stack accepts (LOCAL_WRITE alone is
// rejected there).
const AccessDefault = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead

// GID is a 16-byte global identifier; for RoCE and Thunderbolt it holds an
// IPv6 or IPv4-mapped address.
type GID [16]byte

// IP returns the address the GID holds.
func (g GID) IP() net.IP { return net.IP(g[:]) }

// IsZero reports an unset GID table entry.
func (g GID) IsZero() bool { return g == GID{} }

func (g GID) String() string { return g.IP().String() }

// GIDFromIP returns the GID holding ip (IPv4 addresses are mapped).
func GIDFromIP(ip net.IP) GID {
	var g GID
	copy(g[:], ip.To16())
	return g
}

// PortState is ibv_port_state.
type PortState int

const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// MTU is ibv_mtu: 1 is 256 bytes up to 5, 4096 bytes.
type MTU int

// Bytes is the MTU in bytes (0 when unknown).
func (m MTU) Bytes() int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m
}

// PortAttr is what QueryPort reports.
type PortAttr struct {
	State       PortState
	MaxMTU      MTU
	ActiveMTU   MTU
	GIDTableLen int
	LID         uint16
	LinkLayer   int // 1 InfiniBand, 2 Ethernet
}

// Opcode is the kind of a work completion (ibv_wc_opcode).
type Opcode int

const (
	OpSend Opcode = 0
	OpRecv Opcode = 128
)

// Status is a work completion's status (ibv_wc_status).
type Status int

const (
	StatusSuccess    Status = 0
	StatusLocLenErr  Status = 1
	StatusLocQPOpErr Status = 2
	StatusLocProtErr Status = 4
	StatusFlushErr   Status = 5
	StatusRemInvReq  Status = 9
	StatusRetryExc   Status = 12
	StatusGeneralErr Status = 21
)

func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "success"
	case StatusLocLenErr:
		return "local length error"
	case StatusLocQPOpErr:
		return "local QP operation error"
	case StatusLocProtErr:
		return "local protection error"
	case StatusFlushErr:
		return "work request flushed"
	case StatusRemInvReq:
		return "remote invalid request"
	case StatusRetryExc:
		return "transport retry counter exceeded"
	case StatusGeneralErr:
		return "general error"
	}
	return fmt.Sprintf("status %d", int(s))
}

// WC is a work completion.
type WC struct {
	ID      uint64
	Status  Status
	Opcode  Opcode
	ByteLen uint32
	QPNum   uint32
}

// Frame is the unit in which Apple's stack counts queue depth, and the
// granularity a SEND must match: it fills as many frames as the RECV it
// lands in.
const Frame = 4096

// Frames is the number of 4 KiB frames n bytes occupy.
func Frames(n int) int { return (n + Frame - 1) / Frame }

// ErrNoLibrary is wrapped by the errors of a verbs library that cannot be
// loaded: none installed, or none exists for this system (Windows).
var ErrNoLibrary = errors.New("verbs: no RDMA verbs library")

// ErrNoDevice is wrapped by the errors that say the library is there but
// no RDMA device is: the kernel lacks RDMA, RDMA is disabled, no device is
// attached, or a named one does not exist.
var ErrNoDevice = errors.New("verbs: no RDMA device")

// Unavailable is a provider on which every call fails with err: it stands
// for a library that could not be loaded, so that callers choosing a
// transport treat it like any other RDMA failure.
func Unavailable(err error) Provider { return unavailable{err} }

type unavailable struct{ err error }

func (u unavailable) Devices() ([]string, error)   { return nil, u.err }
func (u unavailable) Open(string) (Context, error) { return nil, u.err }
