package collective

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer"
)

// Link is a reliable, ordered, authenticated frame link to one peer. One
// goroutine may Send while another Receives. After an error the link is
// unusable.
type Link interface {
	// Send sends frame as one message. It does not retain frame after it
	// returns. It ends early, with an error, when ctx ends.
	Send(ctx context.Context, frame []byte) error
	// Recv receives the next message into buf[:cap(buf)] and returns it. A
	// message longer than cap(buf) is an error (ErrFrameTooLong), for which
	// nothing is allocated. It ends early, with an error, when ctx ends or
	// the peer closes (io.EOF).
	Recv(ctx context.Context, buf []byte) ([]byte, error)
	// Close closes the link; the peer's Recv then fails.
	Close() error
}

// ErrFrameTooLong is a Link's error for a message longer than the buffer
// given to Recv.
var ErrFrameTooLong = errors.New("collective: frame longer than expected")

// StreamLink is a Link over a byte stream, each message a 4-byte
// little-endian length and its bytes. The stream must already be
// authenticated (and ordered and reliable, as TCP is); a kvtransfer channel
// (ChannelLink) authenticates itself. A net.Conn's deadlines make ctx end
// blocked calls; other streams see ctx only between messages.
type StreamLink struct {
	c   io.ReadWriteCloser
	br  *bufio.Reader // one read brings a small frame's length and bytes
	smu sync.Mutex
	rmu sync.Mutex
	hd  [4]byte
	rdl bool // a read deadline is set (under rmu)
	wdl bool // a write deadline is set (under smu)
}

// NewStreamLink returns a StreamLink over c.
func NewStreamLink(c io.ReadWriteCloser) *StreamLink {
	return &StreamLink{c: c, br: bufio.NewReaderSize(c, 64<<10)}
}

type deadliner interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// guard bounds the next I/O on the stream by ctx: its deadline, and a
// deadline in the past once it ends. *armed says a deadline is set; with
// neither a deadline nor a way to end, it costs nothing. It returns the
// function that ends the guard.
func (l *StreamLink) guard(ctx context.Context, set func(time.Time) error, armed *bool) func() {
	dl, ok := ctx.Deadline()
	if set == nil || !ok && ctx.Done() == nil {
		if set != nil && *armed {
			set(time.Time{})
			*armed = false
		}
		return func() {}
	}
	set(dl)
	*armed = ok
	stop := context.AfterFunc(ctx, func() { set(time.Unix(1, 0)) })
	return func() {
		if !stop() {
			*armed = true // it fired
		}
	}
}

func (l *StreamLink) setters() (r, w func(time.Time) error) {
	if d, ok := l.c.(deadliner); ok {
		return d.SetReadDeadline, d.SetWriteDeadline
	}
	return nil, nil
}

// ctxErr reports an I/O error caused by ctx as ctx's error.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	var ne net.Error
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) && errors.As(err, &ne) && ne.Timeout() {
		return context.DeadlineExceeded
	}
	return err
}

// Send implements Link.
func (l *StreamLink) Send(ctx context.Context, frame []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if uint64(len(frame)) > 1<<32-1 {
		return fmt.Errorf("collective: frame of %d bytes", len(frame))
	}
	l.smu.Lock()
	defer l.smu.Unlock()
	_, set := l.setters()
	defer l.guard(ctx, set, &l.wdl)()
	var hd [4]byte
	binary.LittleEndian.PutUint32(hd[:], uint32(len(frame)))
	bufs := net.Buffers{hd[:], frame}
	if _, err := bufs.WriteTo(l.c); err != nil {
		return ctxErr(ctx, err)
	}
	return nil
}

// Recv implements Link.
func (l *StreamLink) Recv(ctx context.Context, buf []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.rmu.Lock()
	defer l.rmu.Unlock()
	set, _ := l.setters()
	defer l.guard(ctx, set, &l.rdl)()
	if _, err := io.ReadFull(l.br, l.hd[:]); err != nil {
		return nil, ctxErr(ctx, err)
	}
	n := binary.LittleEndian.Uint32(l.hd[:])
	if uint64(n) > uint64(cap(buf)) {
		return nil, fmt.Errorf("%w: %d bytes, at most %d expected", ErrFrameTooLong, n, cap(buf))
	}
	buf = buf[:n]
	if _, err := io.ReadFull(l.br, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, ctxErr(ctx, err)
	}
	return buf, nil
}

// Close implements Link.
func (l *StreamLink) Close() error { return l.c.Close() }

// ChannelLink is a Link over a kvtransfer channel, which authenticates its
// peer and runs over any kvtransfer transport: TCP, or the RDMA link.
type ChannelLink struct{ Ch *kvtransfer.Channel }

// Send implements Link.
func (l ChannelLink) Send(ctx context.Context, frame []byte) error {
	return l.Ch.Send(ctx, nil, frame)
}

// Recv implements Link. A message longer than buf is read (the channel
// bounds it by its transport's frame limit) and refused.
func (l ChannelLink) Recv(ctx context.Context, buf []byte) ([]byte, error) {
	p, err := l.Ch.Recv(ctx, nil, buf[:cap(buf)])
	if err != nil {
		return nil, err
	}
	if len(p) > cap(buf) {
		l.Ch.Close()
		return nil, fmt.Errorf("%w: %d bytes, at most %d expected", ErrFrameTooLong, len(p), cap(buf))
	}
	return p, nil
}

// Close implements Link.
func (l ChannelLink) Close() error { return l.Ch.Close() }

// ConnectConfig says how to connect a group's ranks over kvtransfer
// channels.
type ConnectConfig struct {
	Group string
	Rank  int
	Ranks int
	// Server is this rank's kvtransfer server; the peers of lower rank
	// dial it.
	Server *kvtransfer.Server
	// Addrs[r] is rank r's server address.
	Addrs []string
	// Secret authenticates the group's channels (at least 16 bytes).
	Secret    []byte
	Transport kvtransfer.Transport // default TCP
	Timeouts  kvtransfer.Timeouts
}

// ChannelID is the id of the channel between ranks a < b, accepted by b.
func ChannelID(group string, a, b int) string {
	return fmt.Sprintf("%s/collective/%d-%d", group, a, b)
}

// Connect opens the links a group of cfg.Ranks needs (every pair up to
// DirectMax ranks, the ring's neighbours above): of each pair, the lower
// rank dials (again while the higher is not yet accepting) and the higher
// accepts. It returns them as Config.Links wants
// them.
func Connect(ctx context.Context, cfg ConnectConfig) ([]Link, error) {
	n, r := cfg.Ranks, cfg.Rank
	if n < 1 || r < 0 || r >= n || len(cfg.Addrs) != n {
		return nil, fmt.Errorf("collective: connect rank %d of %d with %d addresses", r, n, len(cfg.Addrs))
	}
	if cfg.Server == nil && hasLowerPeer(r, n) {
		return nil, fmt.Errorf("collective: connect rank %d: no kvtransfer server", r)
	}
	links := make([]Link, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, p := range peersOf(r, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ch *kvtransfer.Channel
			var err error
			if p < r {
				ch, err = cfg.Server.AcceptChannel(ctx, ChannelID(cfg.Group, p, r), cfg.Secret)
			} else {
				ch, err = dial(ctx, kvtransfer.ChannelConfig{
					Transport: cfg.Transport, Addr: cfg.Addrs[p], ID: ChannelID(cfg.Group, r, p),
					Secret: cfg.Secret, Timeouts: cfg.Timeouts,
				})
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = fmt.Errorf("collective: rank %d: connect rank %d: %w", r, p, err)
				}
				cancel()
				return
			}
			links[p] = ChannelLink{ch}
		}()
	}
	wg.Wait()
	if first != nil {
		for _, l := range links {
			if l != nil {
				l.Close()
			}
		}
		return nil, first
	}
	return links, nil
}

// dial dials a channel, again while the peer is not yet accepting it or
// not yet listening, until ctx ends.
func dial(ctx context.Context, cfg kvtransfer.ChannelConfig) (*kvtransfer.Channel, error) {
	wait := 5 * time.Millisecond
	for {
		ch, err := kvtransfer.DialChannel(ctx, cfg)
		if err == nil || !errors.Is(err, kvtransfer.ErrUnknownSession) && !errors.Is(err, syscall.ECONNREFUSED) {
			return ch, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// hasLowerPeer says rank r has a peer of lower rank, which it accepts.
func hasLowerPeer(r, n int) bool {
	for _, p := range peersOf(r, n) {
		if p < r {
			return true
		}
	}
	return false
}
