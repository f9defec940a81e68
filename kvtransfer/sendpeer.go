package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/internal/crc32c"
	"github.com/tandem-inference/tandem/model"
)

// busyRetry is how long a chunk waits before it is resent after the
// receiver answered that another connection was still receiving it.
const busyRetry = 20 * time.Millisecond

// peer is the sender's state for one endpoint. Every chunk routed to it is
// in exactly one place: not yet sent (fresh), in flight on one connection,
// waiting to be resent, or acknowledged. All fields are guarded by Sender.mu.
type peer struct {
	addr          string
	chunk, window int // the receiver's grid and credit window; 0 until the first WELCOME

	parts map[partKey]*outPart
	// early holds the last WELCOME's verified chunks of parts not handed
	// over yet (a reconnection can come before the layer is put): they are
	// applied when the part arrives, not sent again.
	early  map[partKey]bitmap
	order  []*outPart // in hand-over order
	fresh  []*outPart // parts with chunks never sent
	resend []chunkRef

	layers map[int]bool // END totals
	nParts int
	nBytes int64

	changed chan struct{} // closed and replaced to wake this peer's connections

	chunks, acked int  // chunk counts, for progress in errors
	ended         bool // END sent since the last WELCOME that had not seen one
	committed     bool
	dials         int
	lastErr       error
}

type partKey struct {
	L    int
	kind model.PartKind
}

// outLayer is a handed-over layer until every part is acknowledged
// everywhere.
type outLayer struct {
	L       int
	bytes   int64
	pending int // parts not yet fully acknowledged
}

// outPart is one route of one part: the bytes that become the receiver's part.
type outPart struct {
	layer  *outLayer
	peer   *peer
	kind   model.PartKind
	dtype  model.DType
	shape  []int
	data   []byte // nil once acknowledged or released
	n      int    // chunks on the receiver's grid; -1 until known
	next   int    // next chunk never sent
	acked  []bool
	nacked int
	done   bool
}

type chunkRef struct {
	op        *outPart
	i         int
	notBefore time.Time
}

// inflight is a chunk written on a connection and not yet acknowledged.
type inflight struct {
	seq uint64
	op  *outPart
	i   int
}

func (p *peer) add(op *outPart) {
	p.parts[partKey{op.layer.L, op.kind}] = op
	p.order = append(p.order, op)
	p.fresh = append(p.fresh, op)
	p.layers[op.layer.L] = true
	p.nParts++
	p.nBytes += int64(len(op.data))
}

// sentLayers lists the layers routed to p, sorted.
func (p *peer) sentLayers() []int {
	out := make([]int, 0, len(p.layers))
	for L := range p.layers {
		out = append(out, L)
	}
	slices.Sort(out)
	return out
}

// release drops every reference to state data (the sender is finished).
func (p *peer) release() {
	for _, op := range p.order {
		op.data = nil
	}
	p.fresh, p.resend = nil, nil
}

// firstIncomplete is the lowest layer with a part not yet acknowledged.
func (p *peer) firstIncomplete() int {
	L := -1
	for _, op := range p.order {
		if !op.done && (L < 0 || op.layer.L < L) {
			L = op.layer.L
		}
	}
	return L
}

// unsent reports whether some chunk still has to be (re)sent.
func (p *peer) unsent() bool {
	for _, op := range p.fresh {
		if op.next < op.n {
			return true
		}
	}
	for _, r := range p.resend {
		if !r.op.acked[r.i] {
			return true
		}
	}
	return false
}

// setChunksLocked lays op on its peer's chunk grid.
func (s *Sender) setChunksLocked(op *outPart) {
	op.n = chunkCount(len(op.data), op.peer.chunk)
	op.acked = make([]bool, op.n)
	op.peer.chunks += op.n
	if op.n == 0 {
		s.partDoneLocked(op)
		return
	}
	k := partKey{op.layer.L, op.kind}
	if b := op.peer.early[k]; b != nil {
		delete(op.peer.early, k)
		for i := 0; i < op.n; i++ {
			if b.has(i) {
				s.ackLocked(op, i)
			}
		}
	}
}

func (s *Sender) ackLocked(op *outPart, i int) {
	if op.done || op.acked[i] {
		return
	}
	op.acked[i] = true
	op.nacked++
	op.peer.acked++
	if op.nacked == op.n {
		s.partDoneLocked(op)
	}
}

func (s *Sender) partDoneLocked(op *outPart) {
	op.done = true
	op.data = nil
	op.layer.pending--
	if op.layer.pending == 0 && !s.finished {
		s.held -= op.layer.bytes // the whole layer is with its receivers
		s.heldChangedLocked()
	}
}

// nextChunkLocked picks the next chunk to write: resends first, then fresh
// chunks in hand-over order.
func (s *Sender) nextChunkLocked(p *peer, now time.Time) (*outPart, int, bool) {
	for k := 0; k < len(p.resend); k++ {
		r := p.resend[k]
		if r.op.acked[r.i] {
			p.resend = slices.Delete(p.resend, k, k+1)
			k--
			continue
		}
		if r.notBefore.After(now) {
			continue
		}
		p.resend = slices.Delete(p.resend, k, k+1)
		s.stats.ChunksResent++
		return r.op, r.i, true
	}
	for len(p.fresh) > 0 {
		op := p.fresh[0]
		if op.next >= op.n {
			p.fresh = p.fresh[1:]
			continue
		}
		i := op.next
		op.next++
		if !op.acked[i] { // a WELCOME may have reported it already there
			return op, i, true
		}
	}
	return nil, 0, false
}

// nextResend is how long until a delayed resend is due.
func (p *peer) nextResend(now time.Time) (time.Duration, bool) {
	var d time.Duration
	ok := false
	for _, r := range p.resend {
		if w := r.notBefore.Sub(now); !r.op.acked[r.i] && (!ok || w < d) {
			d, ok = w, true
		}
	}
	return d, ok
}

// applyWelcomeLocked takes the receiver's grid, window and what it already
// holds, so that a reconnecting sender resends only what is missing.
func (s *Sender) applyWelcomeLocked(p *peer, w *header) error {
	if w.Chunk <= 0 || w.Chunk > MaxChunkSize || w.Window <= 0 || w.Window > maxWindow {
		return fmt.Errorf("%w: WELCOME with chunk size %d and window %d", ErrProtocol, w.Chunk, w.Window)
	}
	if w.Committed {
		p.committed = true
		s.checkCommittedLocked()
		return nil
	}
	if p.chunk == 0 {
		p.chunk, p.window = w.Chunk, w.Window
		for _, op := range p.order {
			s.setChunksLocked(op)
		}
	} else if p.chunk != w.Chunk {
		return fmt.Errorf("%w: the receiver changed its chunk size from %d to %d", ErrProtocol, p.chunk, w.Chunk)
	}
	p.early = nil // this WELCOME is the receiver's whole account
	for _, d := range w.Done {
		k := partKey{d.Layer, d.Part}
		op := p.parts[k]
		if op == nil {
			if p.early == nil {
				p.early = map[partKey]bitmap{}
			}
			p.early[k] = bitmap(slices.Clone(d.Bits))
			continue
		}
		if op.done {
			continue
		}
		for i := 0; i < op.n; i++ {
			if bitmap(d.Bits).has(i) {
				s.ackLocked(op, i)
			}
		}
	}
	if !w.Ended {
		p.ended = false
	}
	s.wakePeerLocked(p)
	return nil
}

// sconn is one live connection to a peer.
type sconn struct {
	c         Conn
	window    int
	inflight  []inflight
	lastSeq   uint64
	lastWrite time.Time
	err       error // the first failure, of the reader or the writer
}

func (s *Sender) stoppedLocked(p *peer) bool { return s.finished || p.committed }

// runConn keeps one connection to p alive until the transfer ends:
// dial, handshake, stream, and after a failure redial with backoff.
func (s *Sender) runConn(p *peer) {
	defer s.wg.Done()
	backoff := 10 * time.Millisecond
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		stop := s.stoppedLocked(p)
		s.mu.Unlock()
		if stop {
			return
		}
		c, w, err := s.dial(p)
		if err == nil {
			backoff = 10 * time.Millisecond
			err = s.serve(p, c, w)
		}
		if err == nil {
			continue
		}
		s.mu.Lock()
		if s.finished {
			s.mu.Unlock()
			return
		}
		if fatal(err) {
			e := s.errorLocked(p, err)
			s.mu.Unlock()
			s.fail(e)
			return
		}
		p.lastErr = err
		s.stats.ConnErrors++
		s.mu.Unlock()
		t.Reset(backoff)
		select {
		case <-t.C:
		case <-s.done:
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (s *Sender) dial(p *peer) (Conn, *header, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.to.Handshake)
	defer cancel()
	c, err := s.tr.Dial(ctx, p.addr)
	if err != nil {
		return nil, nil, err
	}
	w, err := clientHandshake(ctx, c, kindTransfer, s.cfg.Session, s.cfg.Secret, s.to.Handshake)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, w, nil
}

// serve streams on one connection until it fails (the error) or the
// transfer is over for p (nil).
func (s *Sender) serve(p *peer, c Conn, w *header) error {
	defer c.Close()
	cs := &sconn{c: c, window: w.Window, lastWrite: time.Now()}
	s.mu.Lock()
	p.dials++
	s.stats.Dials++
	if err := s.applyWelcomeLocked(p, w); err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	c.SetReadDeadline(time.Time{})
	rdone := make(chan struct{})
	go func() {
		defer close(rdone)
		s.readLoop(p, cs)
	}()
	s.writeLoop(p, cs)
	c.Close()
	<-rdone
	s.mu.Lock()
	defer s.mu.Unlock()
	// What was in flight and not acknowledged goes back to be resent; the
	// next WELCOME drops whatever the receiver did verify.
	for _, f := range cs.inflight {
		if !f.op.done && !f.op.acked[f.i] {
			p.resend = append(p.resend, chunkRef{op: f.op, i: f.i})
		}
	}
	cs.inflight = nil
	s.wakePeerLocked(p)
	if s.stoppedLocked(p) {
		return nil
	}
	return cs.err
}

func (s *Sender) connFailedLocked(p *peer, cs *sconn, err error) {
	if cs.err == nil {
		cs.err = err
	}
	s.wakePeerLocked(p)
}

// writeLoop writes chunks within the credit window, then END once everything
// was sent and Close was called, and PINGs when idle. On the transfer's
// failure it tells the receiver with an ABORT.
func (s *Sender) writeLoop(p *peer, cs *sconn) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		var (
			op   *outPart
			idx  int
			ctl  *header
			data []byte
			dh   header
		)
		s.mu.Lock()
		for {
			now := time.Now()
			if s.err != nil {
				msg := s.err.Error()
				ok := cs.err == nil
				s.mu.Unlock()
				if ok {
					s.sendAbort(cs, msg)
				}
				return
			}
			if p.committed || cs.err != nil {
				s.mu.Unlock()
				return
			}
			var ok bool
			if len(cs.inflight) < cs.window {
				if op, idx, ok = s.nextChunkLocked(p, now); ok {
					break
				}
			}
			if s.closing && !p.ended && !p.unsent() {
				p.ended = true
				ctl = &header{Type: frameEnd, Tokens: s.tokens, Base: s.cfg.Base, BaseKey: s.cfg.BaseKey, Layers: len(p.layers), Parts: p.nParts, Bytes: p.nBytes, Sent: p.sentLayers()}
				break
			}
			wait := s.to.KeepAlive - now.Sub(cs.lastWrite)
			if wait <= 0 {
				ctl = &header{Type: framePing}
				break
			}
			if d, ok := p.nextResend(now); ok && d < wait {
				wait = max(d, time.Millisecond)
			}
			ch := p.changed
			s.mu.Unlock()
			t.Reset(wait)
			select {
			case <-ch:
			case <-t.C:
			}
			s.mu.Lock()
		}
		if op != nil {
			cs.lastSeq++
			cs.inflight = append(cs.inflight, inflight{seq: cs.lastSeq, op: op, i: idx})
			off, n := chunkSpan(len(op.data), p.chunk, idx)
			data = op.data[off : off+n]
			dh = header{Type: frameData, Seq: cs.lastSeq, Layer: op.layer.L, Part: op.kind, DType: op.dtype,
				Shape: op.shape, Off: int64(off), Len: int64(n)}
			s.stats.ChunksSent++
			s.stats.BytesSent += int64(n)
			ctl = &dh
		}
		s.mu.Unlock()
		if data != nil {
			ctl.CRC = crc32c.Checksum(data)
		}
		b, err := encodeHeader(ctl)
		if err == nil {
			cs.c.SetWriteDeadline(time.Now().Add(s.to.IO))
			err = cs.c.WriteFrame(b, data)
		}
		if err != nil {
			s.mu.Lock()
			s.connFailedLocked(p, cs, fmt.Errorf("write %s to %s: %w", ctl.Type, cs.c.RemoteAddr(), err))
			s.mu.Unlock()
			return
		}
		cs.lastWrite = time.Now()
	}
}

func (s *Sender) sendAbort(cs *sconn, msg string) {
	b, err := encodeHeader(&header{Type: frameAbort, Msg: msg})
	if err != nil {
		return
	}
	cs.c.SetWriteDeadline(time.Now().Add(min(s.to.IO, time.Second)))
	cs.c.WriteFrame(b, nil)
}

// readLoop takes ACKs, PONGs, the COMMIT or an ERROR from the receiver.
func (s *Sender) readLoop(p *peer, cs *sconn) {
	for {
		cs.c.SetReadDeadline(time.Now().Add(s.to.Idle))
		var h header
		err := readControl(cs.c, &h)
		s.mu.Lock()
		if err == nil {
			switch h.Type {
			case frameAck:
				err = s.onAckLocked(p, cs, &h)
			case framePong:
				s.stats.Pongs++
			case frameCommit:
				p.committed = true
				s.checkCommittedLocked()
				s.wakePeerLocked(p)
				s.mu.Unlock()
				return
			default:
				err = fmt.Errorf("%w: unexpected %s frame from the receiver", ErrProtocol, h.Type)
			}
		}
		if err != nil {
			var re *remoteError
			if !errors.As(err, &re) && !errors.Is(err, ErrProtocol) {
				err = fmt.Errorf("read from %s: %w", cs.c.RemoteAddr(), err)
			}
			s.connFailedLocked(p, cs, err)
			s.mu.Unlock()
			cs.c.Close() // unblocks a writer stuck on a full socket
			return
		}
		s.wakePeerLocked(p)
		s.mu.Unlock()
	}
}

// onAckLocked settles the in-flight chunks up to the cumulative sequence
// number: acknowledged, or queued for a resend.
func (s *Sender) onAckLocked(p *peer, cs *sconn, h *header) error {
	if h.Seq > cs.lastSeq {
		return fmt.Errorf("%w: ACK for sequence %d, only %d sent", ErrProtocol, h.Seq, cs.lastSeq)
	}
	now := time.Now()
	for len(cs.inflight) > 0 && cs.inflight[0].seq <= h.Seq {
		f := cs.inflight[0]
		cs.inflight = cs.inflight[1:]
		switch {
		case slices.Contains(h.Bad, f.seq):
			s.stats.ChecksumErrors++
			p.resend = append(p.resend, chunkRef{op: f.op, i: f.i})
		case slices.Contains(h.Busy, f.seq):
			p.resend = append(p.resend, chunkRef{op: f.op, i: f.i, notBefore: now.Add(busyRetry)})
		default:
			s.ackLocked(f.op, f.i)
		}
	}
	return nil
}
