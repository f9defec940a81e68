package kvtransfer

import (
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"time"
)

// rconn is one authenticated sender connection of a receive session: a
// reader that places, verifies and settles chunks, and a writer that sends
// acknowledgements, keep-alive answers and the session's outcome.
type rconn struct {
	srv  *Server
	c    Conn
	s    *rsession
	peer string

	mu      sync.Mutex // the outbox
	ackSeq  uint64     // last DATA sequence number processed
	sentSeq uint64     // last one acknowledged on the wire
	bad     []uint64   // failed their checksum: resend
	busy    []uint64   // being received on another connection: resend later
	pong    bool
	notice  *header // COMMIT or ERROR
	wake    chan struct{}
}

func newRConn(srv *Server, c Conn, s *rsession) *rconn {
	return &rconn{srv: srv, c: c, s: s, peer: c.RemoteAddr(), wake: make(chan struct{}, 1)}
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

func (rc *rconn) ack(seq uint64, p placement, ok bool) {
	rc.mu.Lock()
	rc.ackSeq = seq
	switch {
	case p == placeBusy:
		rc.busy = append(rc.busy, seq)
	case !ok:
		rc.bad = append(rc.bad, seq)
	}
	rc.mu.Unlock()
	rc.kick()
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
func (rc *rconn) readLoop() (fatal bool, err error) {
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
			ok := true
			if pl == placeClaimed {
				ok = crc32.Checksum(dst, castagnoli) == h.CRC
				if !ok {
					rc.srv.checksumFailures.Add(1)
				}
				rc.s.finish(cl, ok)
			}
			rc.ack(h.Seq, pl, ok)
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
	for {
		select {
		case <-rc.wake:
		case <-quit:
			rc.flush() // a last ERROR or COMMIT, best effort
			return
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
	if rc.ackSeq > rc.sentSeq || len(rc.bad)+len(rc.busy) > 0 {
		frames = append(frames, &header{Type: frameAck, Seq: rc.ackSeq, Bad: rc.bad, Busy: rc.busy})
		rc.sentSeq, rc.bad, rc.busy = rc.ackSeq, nil, nil
	}
	if rc.pong {
		frames = append(frames, &header{Type: framePong})
		rc.pong = false
	}
	if rc.notice != nil {
		frames = append(frames, rc.notice)
		fatal = rc.notice.Type == frameError
		rc.notice = nil
	}
	rc.mu.Unlock()
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
