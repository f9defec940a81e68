package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/internal/crc32c"
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
	rerr     error      // guarded by rmu: a frame was abandoned, the stream is out of step

	// Guarded by l.mu.
	queue       []rslot
	off, frames int        // read position in queue[0] and the frames started before it
	busy        bool       // the reader is reading queue[0]
	tail        uint64     // the writer's last slot, which a next frame may join (0: none)
	tailHdr     slotHeader // its header so far
	closed      bool       // closed locally
	peerClosed  bool
	cont        cont // the reader waits for the rest of a frame
	notify      chan struct{}
}

// cont is a reader waiting in the middle of a frame, got of its pl
// payload bytes placed in dst (nil: the payload is skipped). While on,
// the poller places whole continuation slots into dst itself (deliver)
// instead of queueing them: the reader wakes once for the frame, not once
// per slot. Guarded by l.mu.
type cont struct {
	on      bool
	dst     []byte
	got, pl int
	copying int // slots the poller has taken and copies outside l.mu
}

// wholeContinuation reports whether a data slot of n payload bytes with
// header h is wholly the continuation of a frame that has due bytes left
// to come, framed as ReadFrame requires: it continues with exactly the
// bytes due or a full slot of them (capacity bytes), and no frame starts
// in it. A slot that also starts frames, or that breaks the framing, is
// for the reader, which checks it.
func wholeContinuation(h slotHeader, due, capacity int) bool {
	n := int(h.n)
	return n > 0 && n <= due && int(h.frag) == n && h.nfrag == 0 && (n == due || n == capacity)
}

// deliver takes the data slot idx for the reader waiting on the rest of
// a frame when the slot is wholly a continuation of it and nothing is
// queued before it: it reserves the slot's bytes of the destination and
// the poller copies them there once l.mu is released (link.placeDirect).
// With l.mu held.
func (s *stream) deliver(idx int, h slotHeader) bool {
	c := &s.cont
	if !c.on || len(s.queue) > 0 || !wholeContinuation(h, c.pl-c.got, s.l.capacity) {
		return false
	}
	d := direct{s: s, idx: idx, n: int(h.n)}
	if c.dst != nil {
		d.dst = c.dst[c.got : c.got+d.n]
	}
	c.got += d.n
	c.copying++
	s.l.direct = append(s.l.direct, d)
	s.l.stats.Direct++
	return true
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

// next waits for the stream's head slot and marks the caller a user of
// the arena; it returns the slot, the read position in it and the frames
// that started before that. The caller reads, then calls done.
func (s *stream) next() (r rslot, off, frames int, err error) {
	l := s.l
	l.mu.Lock()
	for {
		if s.closed {
			l.unlock()
			return rslot{}, 0, 0, ErrClosed
		}
		if len(s.queue) > 0 {
			if l.err != nil {
				l.unlock()
				return rslot{}, 0, 0, l.err
			}
			s.busy = true
			l.users.Add(1)
			r, off, frames = s.queue[0], s.off, s.frames
			l.unlock()
			return r, off, frames, nil
		}
		if l.err != nil {
			l.unlock()
			return rslot{}, 0, 0, l.err
		}
		if s.peerClosed {
			l.unlock()
			return rslot{}, 0, 0, io.EOF
		}
		l.unlock()
		select {
		case <-s.notify:
		case <-l.done:
		case <-s.rd.wait():
			return rslot{}, 0, 0, errTimeout
		}
		l.mu.Lock()
	}
}

// await waits, in the middle of a frame with got of its pl payload bytes
// placed in dst, until the frame is whole or a slot is queued for the
// reader; meanwhile the poller may place whole continuation slots into
// dst (deliver). It returns the bytes placed and, with ok, the stream's
// head slot, which the caller reads and then hands back with done. It
// returns only once no copy into dst is under way, so that dst is the
// caller's again whatever happens.
func (s *stream) await(dst []byte, got, pl int) (r rslot, placed int, ok bool, err error) {
	l := s.l
	l.mu.Lock()
	s.cont = cont{on: true, dst: dst, got: got, pl: pl}
	var stop error // why the wait ends short of the frame
	for {
		c := &s.cont
		switch {
		case c.got == pl:
		case s.closed:
			stop = ErrClosed
		case len(s.queue) > 0:
			if l.err != nil {
				stop = l.err
			}
		case l.err != nil:
			stop = l.err
		case s.peerClosed:
			stop = io.EOF
		}
		end := c.got == pl || stop != nil || len(s.queue) > 0
		if end {
			// No more deliveries; wait out those under way.
			c.on = false
		}
		copying := c.copying
		if end && copying == 0 {
			placed = c.got
			if c.got < pl && stop == nil {
				s.busy = true
				l.users.Add(1)
				r, ok = s.queue[0], true
			} else if c.got == pl {
				stop = nil
			}
			s.cont = cont{}
			l.unlock()
			return r, placed, ok, stop
		}
		l.unlock()
		if end {
			// The poller wakes us once its copies are done (it waits
			// for nothing but l.mu): dst is not ours before that.
			<-s.notify
		} else {
			select {
			case <-s.notify:
			case <-l.done:
			case <-s.rd.wait():
				stop = errTimeout
			}
		}
		l.mu.Lock()
	}
}

// done records how far the reader got in the head slot r; a slot read to
// its end, or dropped, goes back to the link.
func (s *stream) done(r rslot, off, frames int, drop bool) {
	l := s.l
	l.mu.Lock()
	defer l.unlock()
	l.users.Done()
	s.busy = false
	if s.closed {
		// Close left the head slot to the reader.
		for _, q := range s.queue {
			l.releaseLocked(q.idx)
		}
		s.queue = nil
		return
	}
	if drop || off >= int(r.h.n) {
		// Shifted down, not resliced: the queue (at most a window of
		// slots) keeps its array, so arrivals never allocate.
		s.queue = s.queue[:copy(s.queue, s.queue[1:])]
		s.off, s.frames = 0, 0
		l.releaseLocked(r.idx)
		return
	}
	s.off, s.frames = off, frames
}

// WriteFrame sends hdr then payload as one frame: an 8-byte prefix (u32
// header length, u32 payload length), the header and the payload. It
// joins the stream's last slot when reserve allows, and continues into
// whole slots when it is larger than what is left of one.
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
	parts := [3][]byte{pre[:], hdr, payload}
	pi, po := 0, 0 // position in parts
	for written := 0; written < total; {
		start := written == 0
		seq, h, buf, err := l.reserve(s.wd, s, start, total, 8+len(hdr))
		if err != nil {
			return err
		}
		n := min(l.capacity-int(h.n), total-written)
		dst := buf[hdrSize+int(h.n) : hdrSize+int(h.n)+n]
		for d := dst; len(d) > 0; {
			c := copy(d, parts[pi][po:])
			d = d[c:]
			po += c
			if po == len(parts[pi]) {
				pi, po = pi+1, 0
			}
		}
		if start {
			h.nfrag++ // frames starting in the slot
		} else {
			h.frag = uint32(n) // bytes continuing a frame, at the start of a fresh slot
		}
		h.pcrc = crc32c.Update(h.pcrc, dst)
		h.n += uint32(n)
		l.commit(seq, h, buf, s)
		written += n
	}
	return nil
}

// ReadFrame reads one frame, copying its payload from the receive slots
// into the buffer place returns. It checks the framing against each
// slot's header: a frame starts where the slot's leading continuation
// ends or where the previous frame ended, a frame that goes on fills its
// slot, the next slot continues it with exactly the bytes due, and a slot
// holds as many frame starts as its header says.
func (s *stream) ReadFrame(place func(header []byte, n int) ([]byte, error)) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.rerr != nil {
		return s.rerr
	}
	l := s.l
	r, off, frames, err := s.next()
	if err != nil {
		return err
	}
	bad := func(r rslot, format string, args ...any) error {
		s.done(r, 0, 0, true)
		s.rerr = fmt.Errorf("%w: stream %d: "+format, append([]any{errFrame, s.id}, args...)...)
		return s.rerr
	}
	b := l.recv[r.idx][hdrSize : hdrSize+int(r.h.n)]
	if off == 0 && r.h.frag != 0 {
		return bad(r, "a slot starts with %d bytes of a frame where a frame starts", r.h.frag)
	}
	rest := b[off:]
	if len(rest) < 8 {
		return bad(r, "%d bytes left in a slot, short of a frame's prefix", len(rest))
	}
	hl := int(binary.LittleEndian.Uint32(rest[0:]))
	pl := int(binary.LittleEndian.Uint32(rest[4:]))
	if hl == 0 || hl > l.cfg.MaxHeader || 8+hl > len(rest) || pl > l.cfg.MaxPayload {
		return bad(r, "header of %d bytes, payload of %d, %d bytes left in the slot", hl, pl, len(rest))
	}
	frames++
	in := min(pl, len(rest)-8-hl) // payload bytes in this slot
	end := off + 8 + hl + in
	switch {
	case frames > int(r.h.nfrag):
		return bad(r, "frame %d starts in a slot of %d frames", frames, r.h.nfrag)
	case in < pl && len(b) != l.capacity:
		return bad(r, "a %d-byte frame goes on after a slot of %d bytes", 8+hl+pl, len(b))
	case end == len(b) && frames != int(r.h.nfrag):
		return bad(r, "a slot of %d frames ends after %d", r.h.nfrag, frames)
	}
	dst, err := place(rest[8:8+hl], pl)
	if err == nil && dst != nil && len(dst) != pl {
		err = fmt.Errorf("rdma: read frame: destination of %d bytes for a %d-byte payload", len(dst), pl)
	}
	if err != nil {
		// The frame is abandoned; what follows it is out of step.
		s.done(r, 0, 0, true)
		s.rerr = fmt.Errorf("rdma: stream %d: a frame was abandoned: %w", s.id, err)
		return err
	}
	if dst != nil {
		copy(dst, rest[8+hl:8+hl+in])
	}
	got := in
	s.done(r, end, frames, false)
	for got < pl {
		r, placed, ok, err := s.await(dst, got, pl)
		got = placed
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			// The rest of the frame is still to come: later reads
			// would take it for frames.
			s.rerr = fmt.Errorf("rdma: stream %d: a frame was abandoned after %d of %d payload bytes: %w", s.id, got, pl, err)
			return err
		}
		if !ok {
			continue // the poller placed the rest
		}
		b := l.recv[r.idx][hdrSize : hdrSize+int(r.h.n)]
		want := min(pl-got, len(b))
		switch {
		case int(r.h.frag) != want:
			return bad(r, "a slot continues %d bytes of a frame where %d are due", r.h.frag, want)
		case want < pl-got && len(b) != l.capacity:
			return bad(r, "a %d-byte frame goes on after a slot of %d bytes", 8+hl+pl, len(b))
		case want == len(b) && r.h.nfrag != 0:
			return bad(r, "%d frames start in a slot a frame fills", r.h.nfrag)
		}
		if dst != nil {
			copy(dst[got:], b[:want])
		}
		got += want
		s.done(r, want, 0, false)
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
		l.unlock()
		return nil
	}
	s.closed = true
	keep := 0
	if s.busy && len(s.queue) > 0 {
		keep = 1 // the reader's: done releases it
	}
	for _, r := range s.queue[keep:] {
		l.releaseLocked(r.idx)
	}
	s.queue = s.queue[:keep]
	peerClosed := s.peerClosed
	s.wake()
	l.broadcast()
	l.unlock()
	if !peerClosed {
		// Best effort and bounded: a slot may have to wait for credit.
		s.sendClose()
	}
	l.mu.Lock()
	delete(l.streams, s.id)
	l.unlock()
	s.rd.stop()
	s.wd.stop()
	return nil
}

func (s *stream) sendClose() {
	l := s.l
	t := time.NewTimer(l.cfg.CloseWait)
	defer t.Stop()
	l.mu.Lock()
	defer l.unlock()
	for l.err == nil && !l.sendSequenced(kindClose, s.id) {
		ch := l.changed
		l.unlock()
		select {
		case <-ch:
		case <-t.C:
			l.mu.Lock()
			return
		}
		l.mu.Lock()
	}
}
