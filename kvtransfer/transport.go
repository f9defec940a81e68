package kvtransfer

import (
	"context"
	"time"
)

// Transport opens connections that move whole frames. A frame is a header,
// opaque bytes to the transport and msgpack to the session layer, and a
// payload. A transport moves frames and owns their integrity framing; the
// session layer above it owns sequence numbers, credits and end-to-end
// acknowledgements. docs/ARCHITECTURE.md, kvtransfer, says why the
// interface is no more than an RDMA transport can provide.
type Transport interface {
	// Dial connects to addr.
	Dial(ctx context.Context, addr string) (Conn, error)
	// Listen accepts connections on addr.
	Listen(addr string) (Listener, error)
}

// Listener accepts transport connections.
type Listener interface {
	// Accept waits for the next connection; it fails once the listener is closed.
	Accept() (Conn, error)
	Close() error
	Addr() string
}

// PlaceFunc is called by ReadFrame with a frame's header, after the
// header's integrity has been checked, and the payload's length n. It
// returns where the payload must land (exactly n bytes), or nil to have the
// transport skip it. Returning an error abandons the frame; the connection
// must then be closed.
type PlaceFunc func(header []byte, n int) ([]byte, error)

// Conn is a frame connection. One goroutine may call WriteFrame while another
// calls ReadFrame; WriteFrame is also safe for concurrent use. After any error
// the connection is unusable and must be closed.
type Conn interface {
	// WriteFrame sends header then payload as one frame. It does not retain
	// either slice after it returns.
	WriteFrame(header, payload []byte) error
	// ReadFrame reads one frame, letting place choose the payload's buffer.
	ReadFrame(place PlaceFunc) error
	// SetReadDeadline and SetWriteDeadline bound the next and pending calls,
	// as in net.Conn; a zero time means none.
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
	// Close releases the connection and unblocks pending calls.
	Close() error
	LocalAddr() string
	RemoteAddr() string
}
