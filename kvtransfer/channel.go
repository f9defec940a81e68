package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Channel is an authenticated, framed, bidirectional message pipe over a
// transport connection: each message is a msgpack header of the user's own
// type plus a raw payload. The decode pipeline mesh uses it to pass a token's
// activations between ranks. One goroutine may Send while another Recvs;
// Send is also safe for concurrent use. A Send or Recv that fails (deadline,
// cancellation, I/O) may leave a frame half-written or half-read, so it
// breaks the channel: later calls fail too.
type Channel struct {
	c  Conn
	id string
	io time.Duration

	smu, rmu  sync.Mutex
	emu       sync.Mutex
	err       error // sticky
	closeOnce sync.Once
	closeErr  error
}

// ChannelConfig says where and how to dial a channel.
type ChannelConfig struct {
	Transport Transport // default TCP
	Addr      string    // the accepting Server's address
	ID        string    // the id the server accepts (Server.AcceptChannel)
	Secret    []byte    // the channel's shared secret (at least 16 bytes)
	Timeouts  Timeouts  // Handshake and IO apply
}

func newChannel(c Conn, id string, io time.Duration) *Channel {
	return &Channel{c: c, id: id, io: io}
}

// DialChannel connects to a server that is accepting channel cfg.ID, proves
// the secret and checks the server's proof.
func DialChannel(ctx context.Context, cfg ChannelConfig) (*Channel, error) {
	if cfg.ID == "" || len(cfg.ID) > maxSessionID || len(cfg.Secret) < minSecret {
		return nil, fmt.Errorf("kvtransfer: dial channel %q: need an id of 1..%d bytes and a secret of at least %d bytes", cfg.ID, maxSessionID, minSecret)
	}
	tr := cfg.Transport
	if tr == nil {
		tr = &TCP{}
	}
	to := cfg.Timeouts.withDefaults()
	dctx, cancel := context.WithTimeout(ctx, to.Handshake)
	defer cancel()
	c, err := tr.Dial(dctx, cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("kvtransfer: dial channel %q at %s: %w", cfg.ID, cfg.Addr, err)
	}
	if _, err := clientHandshake(dctx, c, kindChannel, cfg.ID, cfg.Secret, to.Handshake); err != nil {
		c.Close()
		return nil, fmt.Errorf("kvtransfer: channel %q at %s: %w", cfg.ID, cfg.Addr, err)
	}
	c.SetReadDeadline(time.Time{})
	c.SetWriteDeadline(time.Time{})
	return newChannel(c, cfg.ID, to.IO), nil
}

// ID is the channel's id.
func (ch *Channel) ID() string { return ch.id }

// RemoteAddr is the peer's address.
func (ch *Channel) RemoteAddr() string { return ch.c.RemoteAddr() }

func (ch *Channel) broken() error {
	ch.emu.Lock()
	defer ch.emu.Unlock()
	return ch.err
}

func (ch *Channel) fail(op string, err error) error {
	err = fmt.Errorf("kvtransfer: channel %q: %s: %w", ch.id, op, err)
	ch.emu.Lock()
	if ch.err == nil {
		ch.err = err
	}
	ch.emu.Unlock()
	return err
}

// Send writes one message: hdr (any msgpack-encodable value, or nil) and
// payload. It is bounded by ctx and by the IO timeout.
func (ch *Channel) Send(ctx context.Context, hdr any, payload []byte) error {
	if err := ch.broken(); err != nil {
		return err
	}
	var meta []byte
	if hdr != nil {
		var err error
		if meta, err = msgpack.Marshal(hdr); err != nil {
			return fmt.Errorf("kvtransfer: channel %q: encode header: %w", ch.id, err)
		}
	}
	b, err := encodeHeader(&header{Type: frameMsg, Meta: meta})
	if err != nil {
		return err
	}
	ch.smu.Lock()
	defer ch.smu.Unlock()
	dl := time.Now().Add(ch.io)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	ch.c.SetWriteDeadline(dl)
	stop := context.AfterFunc(ctx, func() { ch.c.SetWriteDeadline(time.Unix(1, 0)) })
	err = ch.c.WriteFrame(b, payload)
	stop()
	if err != nil {
		err = ctxCause(ctx, err)
		return ch.fail("send", err)
	}
	return nil
}

// Recv reads the next message, decoding its header into hdr (a pointer, or
// nil to ignore it) and returning its payload, in buf when it is large enough
// (like append). It waits until a message comes, the peer closes (io.EOF) or
// ctx ends.
func (ch *Channel) Recv(ctx context.Context, hdr any, buf []byte) ([]byte, error) {
	if err := ch.broken(); err != nil {
		return nil, err
	}
	ch.rmu.Lock()
	defer ch.rmu.Unlock()
	dl, _ := ctx.Deadline()
	ch.c.SetReadDeadline(dl)
	stop := context.AfterFunc(ctx, func() { ch.c.SetReadDeadline(time.Unix(1, 0)) })
	var h header
	var out []byte
	err := ch.c.ReadFrame(func(hb []byte, n int) ([]byte, error) {
		if err := decodeHeader(hb, &h); err != nil {
			return nil, err
		}
		switch {
		case h.Type == frameMsg:
		case h.Type == frameError && n == 0:
			return nil, nil
		default:
			return nil, fmt.Errorf("%w: unexpected %s frame on a channel", ErrProtocol, h.Type)
		}
		if cap(buf) >= n {
			out = buf[:n]
		} else {
			out = make([]byte, n)
		}
		return out, nil
	})
	stop()
	if err != nil {
		return nil, ch.fail("recv", ctxCause(ctx, err))
	}
	if h.Type == frameError {
		return nil, ch.fail("recv", &remoteError{code: h.Code, msg: h.Msg})
	}
	if hdr != nil && len(h.Meta) > 0 {
		if err := msgpack.Unmarshal(h.Meta, hdr); err != nil {
			return nil, fmt.Errorf("kvtransfer: channel %q: decode header: %w", ch.id, err)
		}
	}
	return out, nil
}

// ctxCause reports an I/O error caused by ctx (canceled, or its deadline
// reached, which may show as the connection's timeout an instant before the
// context notices) as ctx's error.
func ctxCause(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) && errors.As(err, &ne) && ne.Timeout() {
		return context.DeadlineExceeded
	}
	return err
}

// Close closes the channel; the peer's Recv then returns io.EOF.
func (ch *Channel) Close() error {
	ch.emu.Lock()
	if ch.err == nil {
		ch.err = fmt.Errorf("kvtransfer: channel %q: %w", ch.id, ErrClosed)
	}
	ch.emu.Unlock()
	ch.closeOnce.Do(func() { ch.closeErr = ch.c.Close() })
	return ch.closeErr
}
