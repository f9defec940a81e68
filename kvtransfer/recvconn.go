package kvtransfer

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/internal/crc32c"
)

// ackDelay is how long a receiver may sit on acknowledgements it has not
// batched yet: a sender's credits come back in batches of ackEvery chunks
// while data streams, and at most this late when the stream pauses.
const ackDelay = 500 * time.Microsecond

// rconn is one authenticated sender connection of a receive session: a
// reader that places, verifies, settles and acknowledges chunks, and a
// writer that sends delayed acknowledgements, keep-alive answers and the
// session's outcome.
type rconn struct {
	srv      *Server
	c        Conn
	s        *rsession
	peer     string
	ackEvery uint64

	amu     sync.Mutex // acknowledgements
	ackSeq  uint64     // last DATA sequence number processed
	sentSeq uint64     // last one acknowledged on the wire
	bad     []uint64   // failed their checksum: resend
	busy    []uint64   // being received on another connection: resend later

	mu     sync.Mutex // the writer's outbox
	pong   bool
	notice *header // COMMIT or ERROR
	wake   chan struct{}
}

func newRConn(srv *Server, c Conn, s *rsession) *rconn {
	return &rconn{srv: srv, c: c, s: s, peer: c.RemoteAddr(), wake: make(chan struct{}, 1),
		ackEvery: uint64(max(1, srv.window/4))}
}

func (rc *rconn) kick() {
	select {
	case rc.wake <- struct{}{}:
	default:
	}
}

// notify queues the session's outcome for this connection.
func (rc *rconn) notify(h *header) {
	rc.mu.Lock()
	rc.notice = h
	rc.mu.Unlock()
	rc.kick()
}

// ack records the outcome of DATA frame seq. A rejected chunk is answered at
// once, as is every ackEvery-th chunk, from the reader itself (handing it to
// another goroutine would delay it until the reader blocks); the rest waits
// for the writer's ackDelay, so that a streaming sender costs one ACK per
// batch instead of one per chunk.
func (rc *rconn) ack(seq uint64, p placement, ok bool) error {
	rc.amu.Lock()
	rc.ackSeq = seq
	urgent := false
	switch {
	case p == placeBusy:
		rc.busy = append(rc.busy, seq)
		urgent = true
	case !ok:
		rc.bad = append(rc.bad, seq)
		urgent = true
	}
	n := rc.ackSeq - rc.sentSeq
	rc.amu.Unlock()
	if urgent || n >= rc.ackEvery {
		return rc.flushAcks()
	}
	if n == 1 {
		rc.kick() // the writer flushes after ackDelay
	}
	return nil
}

// flushAcks sends one cumulative ACK for everything processed.
func (rc *rconn) flushAcks() error {
	rc.amu.Lock()
	if rc.ackSeq == rc.sentSeq && len(rc.bad)+len(rc.busy) == 0 {
		rc.amu.Unlock()
		return nil
	}
	h := header{Type: frameAck, Seq: rc.ackSeq, Bad: rc.bad, Busy: rc.busy}
	rc.sentSeq, rc.bad, rc.busy = rc.ackSeq, nil, nil
	rc.amu.Unlock()
	b, err := encodeHeader(&h)
	if err != nil {
		return err
	}
	rc.c.SetWriteDeadline(time.Now().Add(rc.srv.to.IO))
	return rc.c.WriteFrame(b, nil)
}

func (rc *rconn) acksPending() bool {
	rc.amu.Lock()
	defer rc.amu.Unlock()
	return rc.ackSeq != rc.sentSeq
}

func (rc *rconn) run() {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rc.writeLoop(quit)
	}()
	fatal, err := rc.readLoop()
	switch {
	case fatal:
		rc.srv.protocolErrors.Add(1)
		var e *Error
		if !errors.As(err, &e) {
			rc.s.failf(-1, "%w", err)
		} else {
			rc.s.fail(err)
		}
	case err != nil:
		rc.srv.connErrors.Add(1)
	}
	close(quit)
	wg.Wait()
}

// readLoop returns when the connection ends; fatal says the peer broke the
// protocol and the session must fail with err.
// verifyJob is a chunk read into its buffer, waiting for its checksum.
type verifyJob struct {
	seq uint64
	dst []byte
	cl  claim
	pl  placement
	crc uint32
}

// verifyLoop checksums, settles and acknowledges chunks in arrival order,
// while the reader already receives the next one.
func (rc *rconn) verifyLoop(jobs <-chan verifyJob, failed chan<- error) {
	var err error
	for j := range jobs {
		ok := true
		if j.pl == placeClaimed {
			ok = crc32c.Checksum(j.dst) == j.crc
			if !ok {
				rc.srv.checksumFailures.Add(1)
			}
			rc.s.finish(j.cl, ok)
		}
		if err == nil {
			if err = rc.ack(j.seq, j.pl, ok); err != nil {
				failed <- err
				rc.c.Close() // stops the reader
			}
		}
	}
}

// readLoop returns when the connection ends; fatal says the peer broke the
// protocol and the session must fail with err.
func (rc *rconn) readLoop() (fatal bool, err error) {
	jobs := make(chan verifyJob, 2)
	failed := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rc.verifyLoop(jobs, failed)
	}()
	defer func() {
		close(jobs)
		<-done // every chunk read is settled before the connection is let go
		select {
		case ferr := <-failed:
			if !fatal {
				err = ferr
			}
		default:
		}
	}()
	var h header
	expect := uint64(1)
	for {
		var (
			dst  []byte
			cl   claim
			pl   placement
			perr error
		)
		rc.c.SetReadDeadline(time.Now().Add(rc.srv.to.Idle))
		err := rc.c.ReadFrame(func(hb []byte, n int) ([]byte, error) {
			if perr = decodeHeader(hb, &h); perr != nil {
				return nil, perr
			}
			if h.Type != frameData {
				if n != 0 {
					perr = fmt.Errorf("%w: %s frame with a %d-byte payload", ErrProtocol, h.Type, n)
					return nil, perr
				}
				return nil, nil
			}
			if h.Seq != expect {
				// A lost or duplicated frame: the connection is broken,
				// not the peer (an unreliable transport can do this).
				return nil, fmt.Errorf("%w: DATA sequence number %d, expected %d", errFrame, h.Seq, expect)
			}
			dst, cl, pl, perr = rc.s.place(&h, n)
			return dst, perr
		})
		if err != nil {
			if pl == placeClaimed {
				rc.s.finish(cl, false) // the payload did not fully arrive
			}
			if perr != nil {
				return !rc.s.finished(), perr
			}
			return false, err
		}
		switch h.Type {
		case frameData:
			expect++
			jobs <- verifyJob{seq: h.Seq, dst: dst, cl: cl, pl: pl, crc: h.CRC}
		case frameEnd:
			if err := rc.s.end(&h); err != nil {
				return true, err
			}
		case framePing:
			rc.mu.Lock()
			rc.pong = true
			rc.mu.Unlock()
			rc.kick()
		case frameAbort:
			rc.s.failf(-1, "%w: %s", ErrAborted, h.Msg)
			return false, nil
		default:
			return true, fmt.Errorf("%w: unexpected %s frame from the sender", ErrProtocol, h.Type)
		}
	}
}

func (rc *rconn) writeLoop(quit <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	armed := false
	for {
		select {
		case <-rc.wake:
		case <-t.C:
			armed = false
			if rc.flushAcks() != nil {
				rc.c.Close()
				return
			}
			continue
		case <-quit:
			rc.flushAcks()
			rc.flush() // a last ERROR or COMMIT, best effort
			return
		}
		if !armed && rc.acksPending() {
			t.Reset(ackDelay)
			armed = true
		}
		fatal, err := rc.flush()
		if err != nil || fatal {
			rc.c.Close() // unblocks the reader
			return
		}
	}
}

// flush writes what the outbox holds; fatal reports that an ERROR was sent.
func (rc *rconn) flush() (fatal bool, err error) {
	var frames []*header
	rc.mu.Lock()
	if rc.pong {
		frames = append(frames, &header{Type: framePong})
		rc.pong = false
	}
	notice := rc.notice
	rc.notice = nil
	rc.mu.Unlock()
	if notice != nil {
		// Acknowledge what was verified before the outcome.
		if err := rc.flushAcks(); err != nil {
			return false, err
		}
		frames = append(frames, notice)
		fatal = notice.Type == frameError
	}
	for _, f := range frames {
		b, err := encodeHeader(f)
		if err != nil {
			return fatal, err
		}
		rc.c.SetWriteDeadline(time.Now().Add(rc.srv.to.IO))
		if err := rc.c.WriteFrame(b, nil); err != nil {
			return fatal, err
		}
	}
	return fatal, nil
}
