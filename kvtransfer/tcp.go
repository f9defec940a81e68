package kvtransfer

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sync"
	"time"
)

// TCP is the TCP transport. The zero value is ready to use.
//
// A TCP frame is a 12-byte prefix, the header, then the payload:
//
//	u32 header length | u32 payload length | u32 CRC-32C(first 8 bytes ++ header)
//
// all little-endian. The prefix checksum catches a corrupted length or header
// before it is trusted; payload integrity is the session layer's per-chunk
// CRC, which the header carries.
type TCP struct {
	// KeepAlive is the TCP keep-alive idle time and probe interval; 0 means
	// 5 s, negative disables keep-alive probes.
	KeepAlive time.Duration
	// MaxPayload bounds the payload of a received frame; 0 means MaxChunkSize.
	MaxPayload int
	// SocketBuffer sets the kernel send and receive buffer sizes when
	// positive; 0 leaves them to the OS's autotuning.
	SocketBuffer int
}

// errFrame marks a frame whose framing is corrupt: a connection problem, not
// a protocol violation by an authenticated peer.
var errFrame = errors.New("corrupt frame")

const tcpPrefix = 12

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (t *TCP) keepAlive() net.KeepAliveConfig {
	ka := t.KeepAlive
	if ka == 0 {
		ka = 5 * time.Second
	}
	if ka < 0 {
		return net.KeepAliveConfig{Enable: false}
	}
	return net.KeepAliveConfig{Enable: true, Idle: ka, Interval: ka, Count: 3}
}

func (t *TCP) maxPayload() int {
	if t.MaxPayload > 0 {
		return t.MaxPayload
	}
	return MaxChunkSize
}

// Dial connects to addr.
func (t *TCP) Dial(ctx context.Context, addr string) (Conn, error) {
	d := net.Dialer{KeepAliveConfig: t.keepAlive()}
	if t.KeepAlive < 0 {
		d.KeepAlive = -1
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return t.wrap(c.(*net.TCPConn)), nil
}

// Listen accepts connections on addr ("host:port"; port 0 picks one).
func (t *TCP) Listen(addr string) (Listener, error) {
	lc := net.ListenConfig{KeepAliveConfig: t.keepAlive()}
	if t.KeepAlive < 0 {
		lc.KeepAlive = -1
	}
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &tcpListener{l: l.(*net.TCPListener), t: t}, nil
}

func (t *TCP) wrap(c *net.TCPConn) *tcpConn {
	if t.SocketBuffer > 0 {
		_ = c.SetReadBuffer(t.SocketBuffer) // best effort: the OS may clamp it
		_ = c.SetWriteBuffer(t.SocketBuffer)
	}
	return newTCPConn(c, t.maxPayload())
}

func newTCPConn(c net.Conn, maxPayload int) *tcpConn {
	// A small read buffer: control frames and payload heads pass through it,
	// payload bodies are read straight into their destination.
	return &tcpConn{c: c, r: bufio.NewReaderSize(c, 16<<10), maxPayload: maxPayload}
}

type tcpListener struct {
	l *net.TCPListener
	t *TCP
}

func (l *tcpListener) Accept() (Conn, error) {
	c, err := l.l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	return l.t.wrap(c), nil
}

func (l *tcpListener) Close() error { return l.l.Close() }
func (l *tcpListener) Addr() string { return l.l.Addr().String() }

type tcpConn struct {
	c          net.Conn
	r          *bufio.Reader
	maxPayload int

	pre  [tcpPrefix]byte // read side
	hbuf []byte

	wmu  sync.Mutex // write side
	wbuf []byte
	bufs [2][]byte
}

func (c *tcpConn) WriteFrame(hdr, payload []byte) error {
	if len(hdr) == 0 || len(hdr) > MaxHeader {
		return fmt.Errorf("write frame: header of %d bytes (limit %d)", len(hdr), MaxHeader)
	}
	if uint64(len(payload)) > 1<<32-1 {
		return fmt.Errorf("write frame: payload of %d bytes does not fit the prefix", len(payload))
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b := appendFrameHead(c.wbuf[:0], hdr, len(payload))
	c.wbuf = b
	if len(payload) == 0 {
		_, err := c.c.Write(b)
		return err
	}
	// One writev: the payload goes from the caller's buffer to the kernel
	// without an intermediate copy.
	c.bufs = [2][]byte{b, payload}
	bufs := net.Buffers(c.bufs[:])
	_, err := bufs.WriteTo(c.c)
	c.bufs = [2][]byte{}
	return err
}

// appendFrameHead appends a frame's prefix and header, for a payload of n
// bytes, to b.
func appendFrameHead(b, hdr []byte, n int) []byte {
	start := len(b)
	b = append(b, make([]byte, tcpPrefix)...)
	b = append(b, hdr...)
	p := b[start:]
	binary.LittleEndian.PutUint32(p[0:], uint32(len(hdr)))
	binary.LittleEndian.PutUint32(p[4:], uint32(n))
	binary.LittleEndian.PutUint32(p[8:], crc32.Update(crc32.Checksum(p[:8], castagnoli), castagnoli, hdr))
	return b
}

func (c *tcpConn) ReadFrame(place PlaceFunc) error {
	if _, err := io.ReadFull(c.r, c.pre[:]); err != nil {
		return err
	}
	hl := binary.LittleEndian.Uint32(c.pre[0:])
	pl := binary.LittleEndian.Uint32(c.pre[4:])
	if hl == 0 || hl > MaxHeader {
		return fmt.Errorf("%w: header length %d outside 1..%d", errFrame, hl, MaxHeader)
	}
	if uint64(pl) > uint64(c.maxPayload) {
		return fmt.Errorf("%w: payload length %d over the limit %d", errFrame, pl, c.maxPayload)
	}
	if cap(c.hbuf) < int(hl) {
		c.hbuf = make([]byte, hl)
	}
	hdr := c.hbuf[:hl]
	if _, err := io.ReadFull(c.r, hdr); err != nil {
		return err
	}
	sum := crc32.Update(crc32.Checksum(c.pre[:8], castagnoli), castagnoli, hdr)
	if sum != binary.LittleEndian.Uint32(c.pre[8:]) {
		return fmt.Errorf("%w: header checksum mismatch", errFrame)
	}
	dst, err := place(hdr, int(pl))
	if err != nil {
		return err
	}
	if dst == nil {
		_, err := c.r.Discard(int(pl))
		return err
	}
	if len(dst) != int(pl) {
		return fmt.Errorf("read frame: destination of %d bytes for a %d-byte payload", len(dst), pl)
	}
	_, err = io.ReadFull(c.r, dst)
	return err
}

func (c *tcpConn) SetReadDeadline(t time.Time) error  { return c.c.SetReadDeadline(t) }
func (c *tcpConn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }
func (c *tcpConn) Close() error                       { return c.c.Close() }
func (c *tcpConn) LocalAddr() string                  { return c.c.LocalAddr().String() }
func (c *tcpConn) RemoteAddr() string                 { return c.c.RemoteAddr().String() }
