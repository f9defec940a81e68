package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer"
)

// Msg is a message received from the previous rank.
type Msg struct {
	Header
	Payload []byte
	At      time.Time // when its last frame arrived
}

// ErrLinkDown is returned by Send when there is no link to the next rank.
var ErrLinkDown = errors.New("mesh: no link to the next rank")

// link is one live channel of the ring, with its writer (an unbounded queue,
// so that the rank's loop never blocks on a slow peer; the peer's liveness is
// bounded by the idle timeout instead) and its reader. Both ends send
// keep-alives, so a dead peer is noticed within the idle timeout in either
// direction even when no data flows.
type link struct {
	ch   *kvtransfer.Channel
	dir  Dir
	gen  uint64
	opt  *Config
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu    sync.Mutex
	queue []outMsg
	wake  chan struct{} // signalled when the queue grows
	err   error         // why the link died
	dead  chan struct{} // closed when it died
}

type outMsg struct {
	h       *Header
	payload []byte
}

func newLink(ch *kvtransfer.Channel, dir Dir, gen uint64, opt *Config, deliver func(*Msg) bool) *link {
	l := &link{ch: ch, dir: dir, gen: gen, opt: opt, wake: make(chan struct{}, 1), dead: make(chan struct{})}
	l.ctx, l.stop = context.WithCancel(context.Background())
	l.wg.Add(2)
	go l.writeLoop()
	go l.readLoop(deliver)
	return l
}

// fail marks the link dead (the first error wins) and stops its goroutines.
func (l *link) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
		close(l.dead)
	}
	l.mu.Unlock()
	l.stop()
	l.ch.Close()
}

// close stops the link and waits for its goroutines.
func (l *link) close(reason error) {
	l.fail(reason)
	l.wg.Wait()
}

func (l *link) cause() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// errPeerLeft is why a link goes down when its peer said goodbye.
var errPeerLeft = errors.New("the peer left the ring")

// leave says goodbye after everything queued so far, and waits (within
// ctx) until the peer closes its end, reading meanwhile. Closing first
// would lose what is still in flight: a TCP close with unread keep-alives
// resets the connection, discarding the data not yet delivered, such as a
// drained last rank's final tokens.
func (l *link) leave(ctx context.Context) {
	if l.send(&Header{Kind: kindBye}, nil) != nil {
		return
	}
	select {
	case <-l.dead:
	case <-ctx.Done():
	}
}

// send queues a message; it fails only if the link is already dead.
func (l *link) send(h *Header, payload []byte) error {
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrLinkDown, err)
	}
	l.queue = append(l.queue, outMsg{h, payload})
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

func (l *link) writeLoop() {
	defer l.wg.Done()
	ping := &Header{Kind: KindPing}
	t := time.NewTicker(l.opt.Heartbeat)
	defer t.Stop()
	last := time.Now()
	for {
		l.mu.Lock()
		q := l.queue
		l.queue = nil
		l.mu.Unlock()
		for _, m := range q {
			if err := l.write(m); err != nil {
				l.fail(fmt.Errorf("send %s to %s: %w", m.h.Kind, l.ch.RemoteAddr(), err))
				return
			}
			if m.h.Kind == kindBye {
				return // nothing more, not even keep-alives: the reader waits for the peer's close
			}
			last = time.Now()
		}
		select {
		case <-l.ctx.Done():
			return
		case <-l.wake:
		case now := <-t.C:
			if now.Sub(last) >= l.opt.Heartbeat/2 {
				if err := l.ch.Send(l.ctx, ping, nil); err != nil {
					l.fail(fmt.Errorf("keep-alive to %s: %w", l.ch.RemoteAddr(), err))
					return
				}
				last = now
			}
		}
	}
}

// write sends one message, split into frames of at most MaxFrame bytes.
func (l *link) write(m outMsg) error {
	now := time.Now().UnixNano()
	if m.h.Step != nil {
		m.h.Step.SentAt = now
	}
	if m.h.Tokens != nil {
		m.h.Tokens.SentAt = now
	}
	p := m.payload
	first := p
	if len(p) > l.opt.MaxFrame {
		m.h.Size = int64(len(p))
		first = p[:l.opt.MaxFrame]
	}
	if err := l.ch.Send(l.ctx, m.h, first); err != nil {
		return err
	}
	cont := &Header{Kind: kindCont}
	for off := len(first); off < len(p); {
		end := min(off+l.opt.MaxFrame, len(p))
		if err := l.ch.Send(l.ctx, cont, p[off:end]); err != nil {
			return err
		}
		off = end
	}
	return nil
}

func (l *link) readLoop(deliver func(*Msg) bool) {
	defer l.wg.Done()
	closing := false
	for {
		m, err := l.read()
		if err != nil {
			l.fail(fmt.Errorf("receive from %s: %w", l.ch.RemoteAddr(), err))
			return
		}
		if m.Kind == KindPing {
			continue
		}
		if m.Kind == kindBye {
			l.fail(fmt.Errorf("%s: %w", l.ch.RemoteAddr(), errPeerLeft))
			return
		}
		if l.dir == Downstream && m.Kind != KindReset {
			l.fail(fmt.Errorf("%s message from the next rank %s, which only sends keep-alives and resets", m.Kind, l.ch.RemoteAddr()))
			return
		}
		// Once the ring is closing nothing is delivered, but the reader
		// goes on until the peer closes: leave waits for that.
		if !closing && !deliver(m) {
			closing = true
		}
	}
}

// read receives one whole message, each frame within the idle timeout.
func (l *link) read() (*Msg, error) {
	recv := func(h *Header, buf []byte) ([]byte, error) {
		ctx, cancel := context.WithTimeout(l.ctx, l.opt.Idle)
		defer cancel()
		p, err := l.ch.Recv(ctx, h, buf)
		if err != nil && errors.Is(err, context.DeadlineExceeded) && l.ctx.Err() == nil {
			err = fmt.Errorf("nothing received for %v: %w", l.opt.Idle, err)
		}
		return p, err
	}
	m := &Msg{}
	p, err := recv(&m.Header, nil)
	if err != nil {
		return nil, err
	}
	switch {
	case m.Kind == kindCont:
		return nil, fmt.Errorf("continuation frame without a message")
	case m.Size == 0:
		m.Payload = p
	case m.Size < int64(len(p)) || m.Size > l.opt.MaxMessage:
		return nil, fmt.Errorf("%s message of %d bytes (first frame %d, limit %d)", m.Kind, m.Size, len(p), l.opt.MaxMessage)
	default:
		buf := make([]byte, len(p), m.Size)
		copy(buf, p)
		for int64(len(buf)) < m.Size {
			var h Header
			q, err := recv(&h, nil)
			if err != nil {
				return nil, err
			}
			if h.Kind != kindCont || len(q) == 0 || int64(len(buf)+len(q)) > m.Size {
				return nil, fmt.Errorf("%s message: bad continuation (%s frame of %d bytes at %d of %d)", m.Kind, h.Kind, len(q), len(buf), m.Size)
			}
			buf = append(buf, q...)
		}
		m.Payload = buf
	}
	m.At = time.Now()
	return m, nil
}
