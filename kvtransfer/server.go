package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-inference/tandem/model"
)

// ServerConfig configures a decode rank's receiving server.
type ServerConfig struct {
	// Addr is the listen address, e.g. "0.0.0.0:7400"; port 0 picks one.
	Addr string
	// Transport defaults to TCP.
	Transport Transport
	Timeouts  Timeouts
	// ChunkSize is the default chunk grid of sessions (DefaultChunkSize).
	ChunkSize int
	// Window is the credit window granted to each connection (DefaultWindow).
	Window int
	// Linger is how long a finished session's outcome is remembered, so that
	// a sender reconnecting after the commit learns it (default 1 min).
	Linger time.Duration
	// MaxHandshakes bounds connections not yet authenticated (default 64).
	MaxHandshakes int
	// MaxHandshakesPerSource bounds those from one source address, by
	// default MaxHandshakes/4 and at least 1, so that one peer holding
	// connections open without authenticating cannot take every slot; each
	// is bounded by Timeouts.Handshake too. A connection that arrives when
	// its source or the server is at its bound takes the slot of the
	// connection there that has waited longest without answering the
	// challenge, which is closed. An honest sender answers within one round
	// trip, so held slots, even from its own address, cannot keep it out.
	MaxHandshakesPerSource int
}

// Server receives sessions' state on one address for one decode rank, and
// accepts message channels on the same address.
type Server struct {
	tr     Transport
	ln     Listener
	to     Timeouts
	chunk  int
	window int
	linger time.Duration
	slots  preAuthSlots // connections not yet authenticated

	mu       sync.Mutex
	closed   bool
	closing  chan struct{}
	sessions map[string]*rsession // live, and finished ones until they expire
	channels map[string]*pendingChannel
	conns    map[Conn]struct{}
	wg       sync.WaitGroup

	held             atomic.Int64
	committed        atomic.Int64
	bytesVerified    atomic.Int64
	failed           atomic.Int64
	authFailures     atomic.Int64
	protocolErrors   atomic.Int64
	checksumFailures atomic.Int64
	connErrors       atomic.Int64
	// handshakesEvicted counts connections closed unanswered to give
	// their slot to a newer one.
	handshakesEvicted atomic.Int64
}

// ServerStats are counters for tests, metrics and leak checks.
type ServerStats struct {
	Sessions  int   // expected sessions neither committed nor failed
	HeldBytes int64 // state buffers allocated and not yet handed over or freed
	Conns     int   // open connections (not counting handed-out channels)

	Committed        int64
	BytesVerified    int64 // payload bytes of the chunks that passed their checks
	Failed           int64
	AuthFailures     int64 // connections refused for a wrong or replayed proof
	ProtocolErrors   int64 // sessions failed by a peer breaking the protocol
	ChecksumFailures int64 // chunks that failed CRC-32C; none was committed
	ConnErrors       int64 // connections lost (I/O errors, corrupt framing)
	// HandshakesEvicted counts connections closed before they answered the
	// challenge, to give their slot to a newer one (MaxHandshakesPerSource).
	HandshakesEvicted int64
}

// Listen starts a server on cfg.Addr. Close stops it.
func Listen(cfg ServerConfig) (*Server, error) {
	srv := &Server{tr: cfg.Transport, to: cfg.Timeouts.withDefaults(), chunk: cfg.ChunkSize, window: cfg.Window,
		linger: cfg.Linger, closing: make(chan struct{}), sessions: map[string]*rsession{},
		channels: map[string]*pendingChannel{}, conns: map[Conn]struct{}{}}
	if srv.tr == nil {
		srv.tr = &TCP{}
	}
	if srv.chunk == 0 {
		srv.chunk = DefaultChunkSize
	}
	if srv.chunk < 0 || srv.chunk > MaxChunkSize {
		return nil, fmt.Errorf("kvtransfer: chunk size %d outside 1..%d", srv.chunk, MaxChunkSize)
	}
	if srv.window == 0 {
		srv.window = DefaultWindow
	}
	if srv.window < 0 || srv.window > maxWindow {
		return nil, fmt.Errorf("kvtransfer: window %d outside 1..%d", srv.window, maxWindow)
	}
	if srv.linger <= 0 {
		srv.linger = time.Minute
	}
	n := cfg.MaxHandshakes
	if n <= 0 {
		n = 64
	}
	per := cfg.MaxHandshakesPerSource
	if per <= 0 {
		per = max(n/4, 1)
	}
	srv.slots = preAuthSlots{max: n, perSource: min(per, n), held: make([]*preAuthSlot, 0, n), bySource: map[string]int{}}
	ln, err := srv.tr.Listen(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("kvtransfer: listen on %q: %w", cfg.Addr, err)
	}
	srv.ln = ln
	srv.wg.Add(1)
	go srv.serve()
	return srv, nil
}

// Addr is the address the server listens on.
func (srv *Server) Addr() string { return srv.ln.Addr() }

// Expect registers a session. Nothing is allocated until a sender proves the
// session secret; the session fails at spec.Deadline unless committed.
func (srv *Server) Expect(spec ExpectSpec) (*Incoming, error) {
	if spec.LatentDType == 0 {
		spec.LatentDType = model.BF16
	}
	if spec.LatentCapacity == 0 {
		spec.LatentCapacity = spec.Tokens - spec.Base
	}
	if spec.ChunkSize == 0 {
		spec.ChunkSize = srv.chunk
	}
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("kvtransfer: expect session %q: %w", spec.Session, err)
	}
	s := newRSession(srv, spec)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.closed {
		return nil, fmt.Errorf("kvtransfer: expect session %q: server %w", spec.Session, ErrClosed)
	}
	srv.purgeLocked()
	if old := srv.sessions[spec.Session]; old != nil && !old.finished() {
		return nil, fmt.Errorf("kvtransfer: session %q is already expected", spec.Session)
	}
	srv.sessions[spec.Session] = s
	s.mu.Lock()
	s.timer = time.AfterFunc(time.Until(spec.Deadline), s.onDeadline)
	s.mu.Unlock()
	return &Incoming{s: s}, nil
}

// purgeLocked forgets finished sessions whose linger expired.
func (srv *Server) purgeLocked() {
	now := time.Now()
	for id, s := range srv.sessions {
		if s.expired(now) {
			delete(srv.sessions, id)
		}
	}
}

// Stats returns the server's counters.
func (srv *Server) Stats() ServerStats {
	srv.mu.Lock()
	st := ServerStats{Conns: len(srv.conns)}
	for _, s := range srv.sessions {
		if !s.finished() {
			st.Sessions++
		}
	}
	srv.mu.Unlock()
	st.HeldBytes = srv.held.Load()
	st.Committed = srv.committed.Load()
	st.BytesVerified = srv.bytesVerified.Load()
	st.Failed = srv.failed.Load()
	st.AuthFailures = srv.authFailures.Load()
	st.ProtocolErrors = srv.protocolErrors.Load()
	st.ChecksumFailures = srv.checksumFailures.Load()
	st.ConnErrors = srv.connErrors.Load()
	st.HandshakesEvicted = srv.handshakesEvicted.Load()
	return st
}

// Close stops listening, fails every live session, closes every connection
// and waits for the server's goroutines.
func (srv *Server) Close() error {
	srv.mu.Lock()
	if srv.closed {
		srv.mu.Unlock()
		return nil
	}
	srv.closed = true
	close(srv.closing)
	var live []*rsession
	for _, s := range srv.sessions {
		live = append(live, s)
	}
	conns := make([]Conn, 0, len(srv.conns))
	for c := range srv.conns {
		conns = append(conns, c)
	}
	srv.mu.Unlock()
	err := srv.ln.Close()
	for _, s := range live {
		s.failf(-1, "server %w", ErrClosed)
	}
	for _, c := range conns {
		c.Close()
	}
	srv.wg.Wait()
	return err
}

func (srv *Server) serve() {
	defer srv.wg.Done()
	for {
		c, err := srv.ln.Accept()
		if err != nil {
			select {
			case <-srv.closing:
				return
			case <-time.After(20 * time.Millisecond): // e.g. out of file descriptors
				continue
			}
		}
		if !srv.track(c) {
			c.Close()
			return
		}
		sl, evicted := srv.slots.take(sourceOf(c.RemoteAddr()), c)
		if evicted != nil {
			srv.handshakesEvicted.Add(1)
			evicted.Close() // its serveConn ends; its slot is this one's now
		}
		if sl == nil { // every slot is held by a connection that has answered
			srv.untrack(c)
			c.Close()
			continue
		}
		srv.wg.Add(1)
		go srv.serveConn(c, sl)
	}
}

// preAuthSlots counts connections not yet authenticated, in all and per
// source address, oldest first.
type preAuthSlots struct {
	max, perSource int

	mu       sync.Mutex
	held     []*preAuthSlot // oldest first; at most max
	bySource map[string]int
}

// preAuthSlot is one connection's slot.
type preAuthSlot struct {
	src      string
	conn     io.Closer
	answered bool // its HELLO arrived: it is no longer waiting on its peer
}

// take reserves a slot for connection c from src. When the server or that
// source is at its limit, the oldest connection there (of src when the
// source is full, else of any source) that has not answered the challenge
// loses its slot to c: take returns it as evicted, for the caller to close.
// Take returns no slot when none can be had (every holder there has
// answered, and is about to give its slot back).
func (p *preAuthSlots) take(src string, c io.Closer) (sl *preAuthSlot, evicted io.Closer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bySource[src] >= p.perSource || len(p.held) >= p.max {
		fromSrc := p.bySource[src] >= p.perSource
		i := slices.IndexFunc(p.held, func(h *preAuthSlot) bool { return !h.answered && (!fromSrc || h.src == src) })
		if i < 0 {
			return nil, nil
		}
		victim := p.held[i]
		p.removeLocked(i)
		evicted = victim.conn
	}
	sl = &preAuthSlot{src: src, conn: c}
	p.held = append(p.held, sl)
	p.bySource[src]++
	return sl, evicted
}

// answer marks sl's connection as having answered the challenge: it keeps
// its slot until give.
func (p *preAuthSlots) answer(sl *preAuthSlot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sl.answered = true
}

// give gives sl back; a slot already taken over by a newer connection is
// not counted twice.
func (p *preAuthSlots) give(sl *preAuthSlot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.held, sl); i >= 0 {
		p.removeLocked(i)
	}
}

func (p *preAuthSlots) removeLocked(i int) {
	sl := p.held[i]
	p.held = slices.Delete(p.held, i, i+1)
	if p.bySource[sl.src]--; p.bySource[sl.src] <= 0 {
		delete(p.bySource, sl.src)
	}
}

// sourceOf is the host part of a remote address: the peer, whatever port
// it dials from.
func sourceOf(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

func (srv *Server) track(c Conn) bool {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.closed {
		return false
	}
	srv.conns[c] = struct{}{}
	return true
}

func (srv *Server) untrack(c Conn) {
	srv.mu.Lock()
	delete(srv.conns, c)
	srv.mu.Unlock()
}

func (srv *Server) serveConn(c Conn, sl *preAuthSlot) {
	defer srv.wg.Done()
	slot := true
	release := func() {
		if slot {
			slot = false
			srv.slots.give(sl)
		}
	}
	defer release()
	keep := false // set when the connection is handed to a channel's owner
	defer func() {
		if !keep {
			c.Close()
		}
		srv.untrack(c)
	}()
	snonce := newNonce()
	hello, err := srv.readHello(c, snonce)
	if err != nil {
		srv.refuse(c, err)
		return
	}
	srv.slots.answer(sl)
	switch hello.Kind {
	case kindTransfer:
		s, err := srv.authTransfer(hello, snonce)
		if err != nil {
			srv.refuse(c, err)
			return
		}
		release()
		srv.serveTransfer(c, s, hello, snonce)
	case kindChannel:
		keep = srv.serveChannel(c, hello, snonce, release)
	default:
		srv.refuse(c, fmt.Errorf("%w: HELLO for unknown connection kind %d", ErrProtocol, hello.Kind))
	}
}

// readHello sends the CHALLENGE and reads the HELLO, within the handshake
// timeout and without accepting any payload.
func (srv *Server) readHello(c Conn, snonce []byte) (*header, error) {
	dl := time.Now().Add(srv.to.Handshake)
	c.SetWriteDeadline(dl)
	c.SetReadDeadline(dl)
	b, err := encodeHeader(&header{Type: frameChallenge, Version: ProtocolVersion, Nonce: snonce})
	if err != nil {
		return nil, err
	}
	if err := c.WriteFrame(b, nil); err != nil {
		return nil, err
	}
	h := new(header)
	err = c.ReadFrame(func(hb []byte, n int) ([]byte, error) {
		if n != 0 {
			return nil, fmt.Errorf("%w: handshake frame with a %d-byte payload", ErrProtocol, n)
		}
		return nil, decodeHeader(hb, h)
	})
	switch {
	case err != nil:
		return nil, err
	case h.Type != frameHello:
		return nil, fmt.Errorf("%w: expected HELLO, got %s", ErrProtocol, h.Type)
	case h.Version != ProtocolVersion:
		return nil, fmt.Errorf("%w: client speaks version %d, server %d", ErrProtocol, h.Version, ProtocolVersion)
	case h.Session == "" || len(h.Session) > maxSessionID:
		return nil, fmt.Errorf("%w: session id of %d bytes", ErrProtocol, len(h.Session))
	case len(h.Nonce) != nonceSize:
		return nil, fmt.Errorf("%w: client nonce of %d bytes, want %d", ErrProtocol, len(h.Nonce), nonceSize)
	}
	return h, nil
}

// authTransfer finds the session and checks the proof, before anything is
// allocated for the connection.
func (srv *Server) authTransfer(h *header, snonce []byte) (*rsession, error) {
	srv.mu.Lock()
	srv.purgeLocked()
	s := srv.sessions[h.Session]
	srv.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownSession, h.Session)
	}
	if !proofOK(s.spec.Secret, roleClient, kindTransfer, h.Session, snonce, h.Nonce, h.Proof) {
		srv.authFailures.Add(1)
		return nil, fmt.Errorf("%w: proof for session %q does not match its secret and this connection's nonce", ErrAuth, h.Session)
	}
	return s, nil
}

// refuse tells the peer why, best effort, before the connection is closed.
func (srv *Server) refuse(c Conn, err error) {
	var re *remoteError
	if errors.As(err, &re) || !isRefusal(err) {
		return // an I/O error: nobody to tell
	}
	b, e := encodeHeader(&header{Type: frameError, Code: errorCode(err), Msg: err.Error()})
	if e != nil {
		return
	}
	c.SetWriteDeadline(time.Now().Add(srv.to.Handshake))
	c.WriteFrame(b, nil)
}

func isRefusal(err error) bool {
	for _, e := range []error{ErrAuth, ErrUnknownSession, ErrProtocol, ErrDeadline, ErrAborted, ErrCanceled, ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (srv *Server) serveTransfer(c Conn, s *rsession, hello *header, snonce []byte) {
	rc := newRConn(srv, c, s)
	w, err := s.attach(rc)
	if err != nil {
		srv.refuse(c, err)
		return
	}
	defer s.detach(rc)
	w.Version = ProtocolVersion
	w.Proof = proof(s.spec.Secret, roleServer, kindTransfer, hello.Session, snonce, hello.Nonce)
	b, err := encodeHeader(w)
	if err != nil {
		return
	}
	c.SetWriteDeadline(time.Now().Add(srv.to.Handshake))
	if err := c.WriteFrame(b, nil); err != nil || w.Committed {
		return
	}
	rc.run()
}

// pendingChannel is an AcceptChannel waiting for its dialer.
type pendingChannel struct {
	secret  []byte
	claimed bool          // a dialer proved the secret; the result is coming
	result  chan *Channel // the established channel, or nil if its WELCOME failed
}

func (srv *Server) serveChannel(c Conn, h *header, snonce []byte, release func()) bool {
	srv.mu.Lock()
	pc := srv.channels[h.Session]
	srv.mu.Unlock()
	if pc == nil {
		srv.refuse(c, fmt.Errorf("%w: no channel %q is being accepted", ErrUnknownSession, h.Session))
		return false
	}
	if !proofOK(pc.secret, roleClient, kindChannel, h.Session, snonce, h.Nonce, h.Proof) {
		srv.authFailures.Add(1)
		srv.refuse(c, fmt.Errorf("%w: proof for channel %q does not match its secret and this connection's nonce", ErrAuth, h.Session))
		return false
	}
	srv.mu.Lock()
	if srv.channels[h.Session] != pc || pc.claimed {
		srv.mu.Unlock()
		srv.refuse(c, fmt.Errorf("%w: channel %q was already taken", ErrUnknownSession, h.Session))
		return false
	}
	pc.claimed = true
	delete(srv.channels, h.Session)
	srv.mu.Unlock()
	release()
	b, err := encodeHeader(&header{Type: frameWelcome, Version: ProtocolVersion,
		Proof: proof(pc.secret, roleServer, kindChannel, h.Session, snonce, h.Nonce)})
	if err == nil {
		c.SetWriteDeadline(time.Now().Add(srv.to.Handshake))
		err = c.WriteFrame(b, nil)
	}
	if err != nil {
		pc.result <- nil
		return false
	}
	pc.result <- newChannel(c, h.Session, srv.to.IO)
	return true
}

// AcceptChannel waits until a peer dials channel id with its secret (see
// DialChannel), or ctx ends. Each id is accepted once.
func (srv *Server) AcceptChannel(ctx context.Context, id string, secret []byte) (*Channel, error) {
	if id == "" || len(id) > maxSessionID || len(secret) < minSecret {
		return nil, fmt.Errorf("kvtransfer: accept channel %q: need an id of 1..%d bytes and a secret of at least %d bytes", id, maxSessionID, minSecret)
	}
	for {
		pc := &pendingChannel{secret: append([]byte(nil), secret...), result: make(chan *Channel, 1)}
		srv.mu.Lock()
		if srv.closed {
			srv.mu.Unlock()
			return nil, fmt.Errorf("kvtransfer: accept channel %q: server %w", id, ErrClosed)
		}
		if srv.channels[id] != nil {
			srv.mu.Unlock()
			return nil, fmt.Errorf("kvtransfer: channel %q is already being accepted", id)
		}
		srv.channels[id] = pc
		srv.mu.Unlock()
		var stop error
		select {
		case ch := <-pc.result:
			if ch != nil {
				return ch, nil
			}
			continue // the dialer vanished during its WELCOME: wait for the next
		case <-ctx.Done():
			stop = ctx.Err()
		case <-srv.closing:
			stop = fmt.Errorf("server %w", ErrClosed)
		}
		srv.mu.Lock()
		claimed := pc.claimed
		if !claimed {
			delete(srv.channels, id)
		}
		srv.mu.Unlock()
		if claimed {
			if ch := <-pc.result; ch != nil {
				ch.Close()
			}
		}
		return nil, fmt.Errorf("kvtransfer: accept channel %q: %w", id, stop)
	}
}
