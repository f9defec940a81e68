package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/model"
)

// SenderConfig configures the Sender of one sequence.
type SenderConfig struct {
	// Job labels errors; it defaults to Session.
	Job string
	// Session and Secret are the transfer session every receiving rank
	// expects (Server.Expect with the same id and secret).
	Session string
	Secret  []byte
	// Placement routes each layer's parts to the ranks' servers.
	Placement Placement
	// Transport defaults to TCP.
	Transport Transport
	// Conns is the number of parallel connections per endpoint (default 2).
	Conns int
	// MaxHeld bounds the bytes of handed-over layers not yet acknowledged by
	// their receivers; PutLayer blocks beyond it (default 1 GiB). A layer
	// larger than the bound is still taken when nothing else is held.
	MaxHeld int64
	// Deadline bounds the whole transfer: when it passes before every rank
	// committed, the sender fails and frees everything. Required.
	Deadline time.Time
	Timeouts Timeouts
	// Base, when > 0, makes the transfer an append: the receivers already
	// hold the sequence's first Base tokens (their MLA rows), which the
	// layers put here leave out (MLA parts hold the rows from Base on; KDA
	// parts are whole). BaseKey names that prefix (its prefix-key chain
	// link); both go in END and a receiver expecting another base refuses
	// the state.
	Base    int
	BaseKey uint64
}

// Sender streams one sequence's layer states to the decode ranks. It
// implements model.LayerSink: PutLayer takes ownership of each layer (in any
// order, from any goroutine) and returns once it is queued; Close waits until
// every rank has committed; Abort gives up.
type Sender struct {
	cfg    SenderConfig
	job    string
	to     Timeouts
	tr     Transport
	ctx    context.Context // canceled when the sender finishes
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced when held bytes drop or the sender ends
	peers    map[string]*peer
	order    []*peer
	put      map[int]bool
	held     int64
	closing  bool
	tokens   int
	finished bool
	err      error
	done     chan struct{}
	timer    *time.Timer
	stats    SenderStats
}

// SenderStats are counters for tests, metrics and the bench.
type SenderStats struct {
	HeldBytes      int64 // handed over and not yet acknowledged
	Dials          int64 // successful handshakes
	ConnErrors     int64 // connections lost and redialed
	ChunksSent     int64 // DATA frames written, resends included
	BytesSent      int64 // their payload bytes
	ChunksResent   int64 // chunks sent again after a checksum failure, busy answer or lost connection
	ChecksumErrors int64 // chunks the receivers rejected for their CRC
	Pongs          int64 // keep-alive answers received
}

var _ model.LayerSink = (*Sender)(nil)

// NewSender starts connecting to every endpoint of the placement (in the
// background, so the handshakes overlap the first layer's prefill).
func NewSender(cfg SenderConfig) (*Sender, error) {
	switch {
	case cfg.Session == "" || len(cfg.Session) > maxSessionID:
		return nil, fmt.Errorf("kvtransfer: sender: session id must have 1..%d bytes, has %d", maxSessionID, len(cfg.Session))
	case len(cfg.Secret) < minSecret:
		return nil, fmt.Errorf("kvtransfer: sender %q: secret must have at least %d bytes", cfg.Session, minSecret)
	case cfg.Placement == nil:
		return nil, fmt.Errorf("kvtransfer: sender %q: no placement", cfg.Session)
	case cfg.Deadline.IsZero():
		return nil, fmt.Errorf("kvtransfer: sender %q: no deadline", cfg.Session)
	case time.Until(cfg.Deadline) <= 0:
		return nil, fmt.Errorf("kvtransfer: sender %q: deadline %s has already passed", cfg.Session, cfg.Deadline.Format(time.RFC3339Nano))
	case cfg.Conns < 0 || cfg.Conns > 64:
		return nil, fmt.Errorf("kvtransfer: sender %q: %d connections per endpoint (want 1..64)", cfg.Session, cfg.Conns)
	}
	if cfg.Conns == 0 {
		cfg.Conns = 2
	}
	if cfg.MaxHeld <= 0 {
		cfg.MaxHeld = 1 << 30
	}
	cfg.Secret = slices.Clone(cfg.Secret)
	s := &Sender{cfg: cfg, job: cfg.Job, to: cfg.Timeouts.withDefaults(), tr: cfg.Transport,
		changed: make(chan struct{}), peers: map[string]*peer{}, put: map[int]bool{}, done: make(chan struct{})}
	if s.job == "" {
		s.job = cfg.Session
	}
	if s.tr == nil {
		s.tr = &TCP{}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ep := range cfg.Placement.Endpoints() {
		s.peerLocked(ep)
	}
	if len(s.order) == 0 {
		s.cancel()
		return nil, fmt.Errorf("kvtransfer: sender %q: the placement has no endpoints", cfg.Session)
	}
	s.timer = time.AfterFunc(time.Until(cfg.Deadline), s.onDeadline)
	return s, nil
}

// peerLocked returns the endpoint's peer, starting its connections when new.
func (s *Sender) peerLocked(ep string) *peer {
	if p := s.peers[ep]; p != nil {
		return p
	}
	p := &peer{addr: ep, parts: map[partKey]*outPart{}, layers: map[int]bool{}, changed: make(chan struct{})}
	s.peers[ep] = p
	s.order = append(s.order, p)
	for i := 0; i < s.cfg.Conns; i++ {
		s.wg.Add(1)
		go s.runConn(p)
	}
	return p
}

// broadcastLocked wakes every waiter: PutLayer and every connection.
func (s *Sender) broadcastLocked() {
	s.heldChangedLocked()
	for _, p := range s.order {
		s.wakePeerLocked(p)
	}
}

// heldChangedLocked wakes PutLayer calls waiting for held bytes to drop.
func (s *Sender) heldChangedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// wakePeerLocked wakes p's connections (new work, credits, outcome).
func (s *Sender) wakePeerLocked(p *peer) {
	close(p.changed)
	p.changed = make(chan struct{})
}

// PutLayer hands over layer ls.Layer's state; the sender owns it from now
// on. It blocks while more than MaxHeld bytes wait for acknowledgement, until
// ctx ends (then the layer was not taken).
func (s *Sender) PutLayer(ctx context.Context, ls *model.LayerState) error {
	routes, err := s.route(ls)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.err != nil:
		return s.err
	case s.finished || s.closing:
		return fmt.Errorf("kvtransfer: job %s: layer %d handed over after Close", s.job, ls.Layer)
	case s.put[ls.Layer]:
		return fmt.Errorf("kvtransfer: job %s: layer %d handed over twice", s.job, ls.Layer)
	}
	s.put[ls.Layer] = true
	bytes := int64(ls.Bytes())
	for s.held > 0 && s.held+bytes > s.cfg.MaxHeld {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		s.mu.Lock()
		if s.err != nil {
			return s.err
		}
		if s.finished || s.closing {
			return fmt.Errorf("kvtransfer: job %s: layer %d handed over after Close", s.job, ls.Layer)
		}
		if ctx.Err() != nil {
			delete(s.put, ls.Layer)
			return fmt.Errorf("kvtransfer: job %s: layer %d not taken: %w", s.job, ls.Layer, ctx.Err())
		}
	}
	ol := &outLayer{L: ls.Layer, bytes: bytes}
	var parts []*outPart
	for i, rs := range routes {
		src := &ls.Parts[i]
		for _, r := range rs {
			p := s.peerLocked(r.Endpoint)
			shape := r.Shape
			if shape == nil {
				shape = src.Shape
			}
			op := &outPart{layer: ol, peer: p, kind: src.Kind, dtype: src.DType, shape: slices.Clone(shape),
				data: src.Data[r.Off : r.Off+r.Len], n: -1}
			p.add(op)
			parts = append(parts, op)
		}
	}
	ol.pending = len(parts)
	s.held += bytes
	for _, op := range parts {
		if op.peer.chunk > 0 {
			s.setChunksLocked(op)
		}
		s.wakePeerLocked(op.peer)
	}
	return nil
}

// route checks ls and returns each part's routes.
func (s *Sender) route(ls *model.LayerState) ([][]Route, error) {
	if ls == nil {
		return nil, fmt.Errorf("kvtransfer: job %s: nil layer state", s.job)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("kvtransfer: job %s: layer %d: %s", s.job, ls.Layer, fmt.Sprintf(format, args...))
	}
	if len(ls.Parts) == 0 {
		return nil, bad("no parts")
	}
	out := make([][]Route, len(ls.Parts))
	for i := range ls.Parts {
		p := &ls.Parts[i]
		if p.DType.Size() == 0 {
			return nil, bad("part %s has unknown dtype %s", p.Kind, p.DType)
		}
		if len(p.Shape) > maxShapeRank || shapeBytes(p.Shape, p.DType.Size()) != len(p.Data) {
			return nil, bad("part %s: shape %v of %s does not match its %d bytes", p.Kind, p.Shape, p.DType, len(p.Data))
		}
		for j := 0; j < i; j++ {
			if ls.Parts[j].Kind == p.Kind {
				return nil, bad("part %s appears twice", p.Kind)
			}
		}
		rs, err := s.cfg.Placement.Routes(ls.Layer, p.Kind, len(p.Data), p.Shape)
		if err != nil {
			return nil, bad("part %s: %v", p.Kind, err)
		}
		if len(rs) == 0 {
			return nil, bad("part %s: the placement gives no destination", p.Kind)
		}
		for k, r := range rs {
			switch {
			case r.Endpoint == "":
				return nil, bad("part %s: route without endpoint", p.Kind)
			case r.Off < 0 || r.Len < 0 || r.Off+r.Len > len(p.Data):
				return nil, bad("part %s: route [%d, +%d) outside its %d bytes", p.Kind, r.Off, r.Len, len(p.Data))
			case r.Shape == nil && (r.Off != 0 || r.Len != len(p.Data)):
				return nil, bad("part %s: a partial route needs the receiver's shape", p.Kind)
			case r.Shape != nil && (len(r.Shape) > maxShapeRank || shapeBytes(r.Shape, p.DType.Size()) != r.Len):
				return nil, bad("part %s: route shape %v does not match its %d bytes", p.Kind, r.Shape, r.Len)
			}
			for _, q := range rs[:k] {
				if q.Endpoint == r.Endpoint {
					return nil, bad("part %s: two routes to %s", p.Kind, r.Endpoint)
				}
			}
		}
		out[i] = rs
	}
	return out, nil
}

// Close says every layer has been handed over for a sequence of tokens
// cached tokens and waits until every rank has committed. If ctx ends first,
// the transfer is aborted.
func (s *Sender) Close(ctx context.Context, tokens int) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return fmt.Errorf("kvtransfer: job %s: Close called twice", s.job)
	}
	s.closing = true
	s.tokens = tokens
	s.broadcastLocked()
	s.mu.Unlock()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.mu.Lock()
		err := s.errorLocked(s.firstPendingLocked(), fmt.Errorf("waiting for the commit: %w", ctx.Err()))
		s.mu.Unlock()
		s.fail(err)
	}
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Abort gives up on the sequence: everything held is released, and the
// connected receivers are told why (best effort) so they free their buffers.
// It does nothing once every rank has committed.
func (s *Sender) Abort(reason error) {
	msg := "no reason given"
	if reason != nil {
		msg = reason.Error()
	}
	s.mu.Lock()
	err := s.errorLocked(nil, fmt.Errorf("%w: %s", ErrAborted, msg))
	s.mu.Unlock()
	s.fail(err)
	s.wg.Wait()
}

// Stats returns the sender's counters.
func (s *Sender) Stats() SenderStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.HeldBytes = s.held
	return st
}

// fail ends the transfer with err unless it already ended.
func (s *Sender) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finished {
		return
	}
	s.err = err
	s.endLocked()
}

// endLocked releases everything and wakes every waiter.
func (s *Sender) endLocked() {
	s.finished = true
	s.held = 0
	for _, p := range s.order {
		p.release()
	}
	s.timer.Stop()
	s.cancel()
	close(s.done)
	s.broadcastLocked()
}

func (s *Sender) checkCommittedLocked() {
	if s.finished {
		return
	}
	for _, p := range s.order {
		if !p.committed {
			return
		}
	}
	s.endLocked()
}

func (s *Sender) onDeadline() {
	s.mu.Lock()
	p := s.firstPendingLocked()
	detail := "no endpoint pending"
	if p != nil {
		detail = fmt.Sprintf("%d of %d chunks acknowledged", p.acked, p.chunks)
		if p.lastErr != nil {
			detail += fmt.Sprintf("; last connection error: %v", p.lastErr)
		} else if p.dials == 0 {
			detail += "; never connected"
		}
	}
	err := s.errorLocked(p, fmt.Errorf("%w: %s", ErrDeadline, detail))
	s.mu.Unlock()
	s.fail(err)
}

// firstPendingLocked is the first endpoint that has not committed.
func (s *Sender) firstPendingLocked() *peer {
	for _, p := range s.order {
		if !p.committed {
			return p
		}
	}
	return nil
}

// errorLocked names the job, p's first incomplete layer and p.
func (s *Sender) errorLocked(p *peer, err error) *Error {
	e := &Error{Job: s.job, Session: s.cfg.Session, Layer: -1, Err: err}
	if p != nil {
		e.Peer = p.addr
		e.Layer = p.firstIncomplete()
	}
	return e
}

// fatal reports whether a connection error ends the transfer rather than
// being retried on a new connection: a refusal by the receiver, a server
// that cannot prove the secret, or a broken protocol.
func fatal(err error) bool {
	var re *remoteError
	return errors.As(err, &re) || errors.Is(err, ErrAuth) || errors.Is(err, ErrProtocol)
}

// SendState ships a whole prefilled state under cfg: every layer to its
// owner, then the commit of st.Tokens tokens. On an error the session is
// aborted, so the receivers drop what they got.
func SendState(ctx context.Context, cfg SenderConfig, st *model.SeqState) error {
	snd, err := NewSender(cfg)
	if err != nil {
		return err
	}
	for _, ls := range st.Layers {
		if err := snd.PutLayer(ctx, ls); err != nil {
			snd.Abort(err)
			return err
		}
	}
	return snd.Close(ctx, st.Tokens)
}
