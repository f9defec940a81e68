package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// errTimeout is a deadline passing; like the net package's, it is
// os.ErrDeadlineExceeded, a net.Error whose Timeout is true.
var errTimeout = os.ErrDeadlineExceeded

// errFrame marks a frame whose framing is corrupt.
var errFrame = errors.New("rdma: corrupt frame")

// deadline is a settable deadline whose expiry closes a channel, as in
// net.Pipe.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	gen   uint64 // a timer of an older setting must not close the channel
	ch    chan struct{}
}

func newDeadline() *deadline { return &deadline{ch: make(chan struct{})} }

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if isClosed(d.ch) {
		d.ch = make(chan struct{})
	}
	if t.IsZero() {
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		close(d.ch)
		return
	}
	gen := d.gen
	d.timer = time.AfterFunc(dur, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.gen == gen && !isClosed(d.ch) {
			close(d.ch)
		}
	})
}

func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.gen++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

type rslot struct {
	idx int
	h   slotHeader
}

// stream is one logical connection over a link: the frames of one
// kvtransfer connection or channel.
type stream struct {
	l  *link
	id uint32
	rd *deadline
	wd *deadline

	rmu, wmu sync.Mutex // one reader, one writer at a time

	// Guarded by l.mu.
	queue      []rslot
	closed     bool // closed locally
	peerClosed bool
	notify     chan struct{}
}

func newStream(l *link, id uint32) *stream {
	return &stream{l: l, id: id, rd: newDeadline(), wd: newDeadline(), notify: make(chan struct{}, 1)}
}

// wake signals the stream's reader; with l.mu held.
func (s *stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// writeErr is why the stream cannot be written; with l.mu held.
func (s *stream) writeErr() error {
	switch {
	case s.closed:
		return ErrClosed
	case s.peerClosed:
		return ErrPeerClosed
	}
	return nil
}

// next waits for the stream's next received slot and marks the caller a
// user of the arena; the caller copies out, then calls done.
func (s *stream) next() (rslot, error) {
	l := s.l
	l.mu.Lock()
	for {
		if s.closed {
			l.mu.Unlock()
			return rslot{}, ErrClosed
		}
		if len(s.queue) > 0 {
			r := s.queue[0]
			s.queue = s.queue[1:]
			if l.err != nil {
				l.mu.Unlock()
				return rslot{}, l.err
			}
			l.users.Add(1)
			l.mu.Unlock()
			return r, nil
		}
		if l.err != nil {
			l.mu.Unlock()
			return rslot{}, l.err
		}
		if s.peerClosed {
			l.mu.Unlock()
			return rslot{}, io.EOF
		}
		l.mu.Unlock()
		select {
		case <-s.notify:
		case <-l.done:
		case <-s.rd.wait():
			return rslot{}, errTimeout
		}
		l.mu.Lock()
	}
}

// done releases a slot the reader has copied out of.
func (s *stream) done(r rslot) {
	l := s.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.users.Done()
	l.releaseLocked(r.idx)
}

// WriteFrame sends hdr then payload as one frame: the first fragment
// starts with the u32 header length and u32 payload length.
func (s *stream) WriteFrame(hdr, payload []byte) error {
	l := s.l
	if len(hdr) == 0 || len(hdr) > l.cfg.MaxHeader || 8+len(hdr) > l.capacity {
		return fmt.Errorf("rdma: write frame: header of %d bytes (limit %d)", len(hdr), min(l.cfg.MaxHeader, l.capacity-8))
	}
	if len(payload) > l.cfg.MaxPayload {
		return fmt.Errorf("rdma: write frame: payload of %d bytes (limit %d)", len(payload), l.cfg.MaxPayload)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var pre [8]byte
	binary.LittleEndian.PutUint32(pre[0:], uint32(len(hdr)))
	binary.LittleEndian.PutUint32(pre[4:], uint32(len(payload)))
	total := 8 + len(hdr) + len(payload)
	nfrag := (total + l.capacity - 1) / l.capacity
	parts := [3][]byte{pre[:], hdr, payload}
	pi, po := 0, 0 // position in parts
	for f := 0; f < nfrag; f++ {
		seq, buf, err := l.reserve(s.wd, s)
		if err != nil {
			return err
		}
		n := min(l.capacity, total-f*l.capacity)
		dst := buf[hdrSize : hdrSize+n]
		for len(dst) > 0 {
			c := copy(dst, parts[pi][po:])
			dst = dst[c:]
			po += c
			if po == len(parts[pi]) {
				pi, po = pi+1, 0
			}
		}
		l.commit(seq, slotHeader{stream: s.id, kind: kindData, frag: uint32(f), nfrag: uint32(nfrag), n: uint32(n)}, buf)
	}
	return nil
}

// ReadFrame reads one frame, copying its payload from the receive slots
// into the buffer place returns.
func (s *stream) ReadFrame(place func(header []byte, n int) ([]byte, error)) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	l := s.l
	r, err := s.next()
	if err != nil {
		return err
	}
	b := l.recv[r.idx][hdrSize : hdrSize+int(r.h.n)]
	if r.h.frag != 0 || len(b) < 8 {
		s.done(r)
		return fmt.Errorf("%w: stream %d: fragment %d of %d starts a frame", errFrame, s.id, r.h.frag, r.h.nfrag)
	}
	hl := int(binary.LittleEndian.Uint32(b[0:]))
	pl := int(binary.LittleEndian.Uint32(b[4:]))
	if hl == 0 || hl > l.cfg.MaxHeader || 8+hl > len(b) || pl > l.cfg.MaxPayload {
		s.done(r)
		return fmt.Errorf("%w: stream %d: header of %d bytes, payload of %d", errFrame, s.id, hl, pl)
	}
	total := 8 + hl + pl
	nfrag := (total + l.capacity - 1) / l.capacity
	if int(r.h.nfrag) != nfrag || (nfrag == 1 && len(b) != total) || (nfrag > 1 && len(b) != l.capacity) {
		s.done(r)
		return fmt.Errorf("%w: stream %d: %d fragments for a %d-byte frame", errFrame, s.id, r.h.nfrag, total)
	}
	dst, err := place(b[8:8+hl], pl)
	if err == nil && dst != nil && len(dst) != pl {
		err = fmt.Errorf("rdma: read frame: destination of %d bytes for a %d-byte payload", len(dst), pl)
	}
	if err != nil {
		s.done(r)
		return err
	}
	got := 0
	if dst != nil {
		got = copy(dst, b[8+hl:])
	} else {
		got = len(b) - 8 - hl
	}
	s.done(r)
	for f := 1; f < nfrag; f++ {
		r, err := s.next()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		b := l.recv[r.idx][hdrSize : hdrSize+int(r.h.n)]
		want := min(l.capacity, total-f*l.capacity)
		if int(r.h.frag) != f || int(r.h.nfrag) != nfrag || len(b) != want {
			s.done(r)
			return fmt.Errorf("%w: stream %d: fragment %d/%d of %d bytes where %d/%d of %d was due", errFrame, s.id, r.h.frag, r.h.nfrag, len(b), f, nfrag, want)
		}
		if dst != nil {
			copy(dst[got:], b)
		}
		got += len(b)
		s.done(r)
	}
	return nil
}

func (s *stream) SetReadDeadline(t time.Time) error  { s.rd.set(t); return nil }
func (s *stream) SetWriteDeadline(t time.Time) error { s.wd.set(t); return nil }

// Close closes the stream: the peer reads io.EOF after what was sent.
func (s *stream) Close() error {
	l := s.l
	l.mu.Lock()
	if s.closed {
		l.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, r := range s.queue {
		l.releaseLocked(r.idx)
	}
	s.queue = nil
	peerClosed := s.peerClosed
	s.wake()
	l.broadcast()
	l.mu.Unlock()
	if !peerClosed {
		// Best effort and bounded: a slot may have to wait for credit.
		s.sendClose()
	}
	l.mu.Lock()
	delete(l.streams, s.id)
	l.mu.Unlock()
	s.rd.stop()
	s.wd.stop()
	return nil
}

func (s *stream) sendClose() {
	l := s.l
	t := time.NewTimer(l.cfg.CloseWait)
	defer t.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.err == nil && !l.sendSequenced(kindClose, s.id) {
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			l.mu.Lock()
			return
		}
		l.mu.Lock()
	}
}
