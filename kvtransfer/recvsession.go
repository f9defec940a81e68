package kvtransfer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/model"
)

// ExpectSpec is what a decode rank knows about a session before any byte
// arrives (from the job's admission): every shape and dtype a sender may send
// follows from it, and headers are checked against it, never trusted.
type ExpectSpec struct {
	// Job labels errors; it defaults to Session.
	Job string
	// Session and Secret authenticate the sender (HMAC-SHA256 proofs).
	Session string
	Secret  []byte
	// Model, Layers, Tokens, LatentDType and Shard fix the expected parts:
	// Model.ExpectedShardParts(L, Tokens, LatentDType, Shard) for each
	// owned layer L.
	Model       *model.Config
	Layers      []int
	Tokens      int
	LatentDType model.DType // zero means BF16
	// Shard is this rank's tensor shard: a split one receives its slice of
	// each KDA layer (model.Config.ShardLayerState) and refuses the whole
	// state. Zero: the layers unsplit.
	Shard model.Shard
	// LatentCapacity is the number of tokens of room allocated in each MLA
	// latent buffer (at least Tokens), so that decode appends to the
	// committed state without copying it. Zero means Tokens.
	LatentCapacity int
	// Base, when > 0, expects an append: this rank holds the sequence's
	// first Base tokens already, so MLA parts carry Tokens-Base rows (the
	// rows from Base on) and KDA parts are whole; the committed state's
	// MLA parts hold those rows only, for the caller to append to its own.
	// The sender must name the same Base and BaseKey (the prefix-key link
	// of those tokens) in END, or the state is refused.
	Base    int
	BaseKey uint64
	// Deadline bounds the whole transfer; at the deadline the session fails
	// and its buffers are freed. Required.
	Deadline time.Time
	// ChunkSize overrides the server's chunk grid for this session.
	ChunkSize int
}

// Incoming is a receive session registered with Server.Expect.
type Incoming struct{ s *rsession }

// Wait returns the committed state: Tokens and, for the owned layers only,
// their LayerStates. Ownership passes to the caller. It fails with the
// session's error (deadline, abort, cancel, protocol violation) or ctx's.
func (in *Incoming) Wait(ctx context.Context) (*model.SeqState, error) {
	select {
	case <-in.s.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	in.s.mu.Lock()
	defer in.s.mu.Unlock()
	return in.s.result, in.s.err
}

// Cancel gives up on the session: buffers are freed, connections closed and
// the sender told so. After a commit it only drops the handle's reference.
func (in *Incoming) Cancel() {
	s := in.s
	s.mu.Lock()
	err := s.errorf(-1, "%w", ErrCanceled)
	s.mu.Unlock()
	s.fail(err)
	s.mu.Lock()
	s.result = nil
	s.mu.Unlock()
}

// Progress reports verified bytes against the expected total.
func (in *Incoming) Progress() (got, want int64) {
	in.s.mu.Lock()
	defer in.s.mu.Unlock()
	return in.s.gotBytes, in.s.wantBytes
}

type rstate uint8

const (
	rWaiting   rstate = iota // expected; nothing allocated yet
	rReceiving               // a sender authenticated; buffers allocated
	rCommitted
	rFailed
)

type chunkState uint8

const (
	chunkMissing  chunkState = iota
	chunkClaimed             // being received on one connection
	chunkVerified            // written and checksum verified
)

// rsession is the receiver's state for one expected session. Chunks are
// received straight into the preallocated state buffers, which decode cannot
// see before the commit; a chunk whose checksum fails stays missing and is
// overwritten by the resend, and a chunk is written by at most one
// connection at a time (claimed), so a verified range is never touched again.
type rsession struct {
	srv   *Server
	spec  ExpectSpec
	job   string
	chunk int
	start time.Time

	mu        sync.Mutex
	state     rstate
	layers    []*rlayer // owned layers in spec order, with buffers once allocated
	byLayer   map[int]*rlayer
	missing   int // chunks not yet verified
	wantBytes int64
	gotBytes  int64
	nParts    int
	held      int64 // bytes allocated for buffers, until commit or failure
	ended     bool
	conns     map[*rconn]struct{}
	peer      string // the last sender connection's address
	result    *model.SeqState
	err       error
	done      chan struct{}
	timer     *time.Timer
	expires   time.Time // when a finished session is forgotten
}

type rlayer struct {
	L       int
	ls      *model.LayerState
	parts   []rpart
	missing int
}

type rpart struct {
	want    model.Part // kind, dtype, shape expected
	size    int
	chunks  []chunkState
	missing int
}

func (sp *ExpectSpec) validate() error {
	switch {
	case sp.Session == "" || len(sp.Session) > maxSessionID:
		return fmt.Errorf("session id must have 1..%d bytes, has %d", maxSessionID, len(sp.Session))
	case len(sp.Secret) < minSecret:
		return fmt.Errorf("session secret must have at least %d bytes, has %d", minSecret, len(sp.Secret))
	case sp.Model == nil:
		return fmt.Errorf("no model config")
	case len(sp.Layers) == 0:
		return fmt.Errorf("no layers to receive")
	case sp.Tokens < 0:
		return fmt.Errorf("negative token count %d", sp.Tokens)
	case sp.LatentDType != model.BF16 && sp.LatentDType != model.F32:
		return fmt.Errorf("latent dtype %s is not BF16 or F32", sp.LatentDType)
	case sp.Base < 0 || sp.Base > sp.Tokens:
		return fmt.Errorf("append base of %d tokens for a state of %d", sp.Base, sp.Tokens)
	case sp.LatentCapacity < sp.Tokens-sp.Base:
		return fmt.Errorf("latent capacity %d is below the %d tokens", sp.LatentCapacity, sp.Tokens-sp.Base)
	case sp.Deadline.IsZero():
		return fmt.Errorf("no deadline")
	case time.Until(sp.Deadline) <= 0:
		return fmt.Errorf("deadline %s has already passed", sp.Deadline.Format(time.RFC3339Nano))
	case sp.ChunkSize <= 0 || sp.ChunkSize > MaxChunkSize:
		return fmt.Errorf("chunk size %d outside 1..%d", sp.ChunkSize, MaxChunkSize)
	case sp.Shard.Ranks < 0 || sp.Shard.Rank < 0 || sp.Shard.Rank >= max(sp.Shard.Ranks, 1):
		return fmt.Errorf("tensor rank %d of %d: want 0 <= rank < ranks", sp.Shard.Rank, sp.Shard.Ranks)
	}
	if err := sp.Model.CheckShard(max(sp.Shard.Ranks, 1)); err != nil {
		return err
	}
	seen := map[int]bool{}
	for _, L := range sp.Layers {
		if L < 0 || L >= sp.Model.NumLayers {
			return fmt.Errorf("layer %d outside the model's 0..%d", L, sp.Model.NumLayers-1)
		}
		if seen[L] {
			return fmt.Errorf("layer %d listed twice", L)
		}
		seen[L] = true
	}
	return nil
}

func newRSession(srv *Server, sp ExpectSpec) *rsession {
	sp.Layers = slices.Clone(sp.Layers)
	slices.Sort(sp.Layers)
	sp.Secret = slices.Clone(sp.Secret)
	s := &rsession{srv: srv, spec: sp, job: sp.Job, chunk: sp.ChunkSize, start: time.Now(),
		byLayer: map[int]*rlayer{}, conns: map[*rconn]struct{}{}, done: make(chan struct{})}
	if s.job == "" {
		s.job = sp.Session
	}
	// Everything but the buffers: those wait for an authenticated sender.
	for _, L := range sp.Layers {
		rl := &rlayer{L: L}
		for _, p := range sp.Model.ExpectedShardParts(L, sp.Tokens-sp.Base, sp.LatentDType, sp.Shard) {
			size := p.Elems() * p.DType.Size()
			n := chunkCount(size, s.chunk)
			rl.parts = append(rl.parts, rpart{want: p, size: size, missing: n})
			rl.missing += n
			s.wantBytes += int64(size)
			s.nParts++
		}
		s.missing += rl.missing
		s.layers = append(s.layers, rl)
		s.byLayer[L] = rl
	}
	return s
}

// sliceNote says, on a split rank, that a shape names its slice.
func (s *rsession) sliceNote() string {
	if !s.spec.Shard.Split() {
		return ""
	}
	return fmt.Sprintf(" (the slice of %s)", s.spec.Shard)
}

// errorf builds the session's error; called with mu held (it reads peer).
func (s *rsession) errorf(layer int, format string, args ...any) *Error {
	return &Error{Job: s.job, Session: s.spec.Session, Layer: layer, Peer: s.peer, Err: fmt.Errorf(format, args...)}
}

// allocate gives every owned layer its buffers. Called with mu held, on the
// first authenticated connection and never before.
func (s *rsession) allocate() {
	for _, rl := range s.layers {
		rl.ls = &model.LayerState{Layer: rl.L, Kind: s.spec.Model.LayerKind(rl.L), Parts: make([]model.Part, len(rl.parts))}
		for i := range rl.parts {
			rp := &rl.parts[i]
			c := rp.size
			if rp.want.Kind == model.PartLatent { // [T, width]: room for LatentCapacity rows
				c = s.spec.LatentCapacity * rp.want.Shape[1] * rp.want.DType.Size()
			}
			rl.ls.Parts[i] = model.Part{Kind: rp.want.Kind, DType: rp.want.DType,
				Shape: slices.Clone(rp.want.Shape), Data: make([]byte, rp.size, c)}
			prefault(rl.ls.Parts[i].Data)
			rp.chunks = make([]chunkState, chunkCount(rp.size, s.chunk))
			s.held += int64(c)
		}
	}
	s.srv.held.Add(s.held)
}

// attach registers an authenticated connection and returns its WELCOME.
func (s *rsession) attach(rc *rconn) (*header, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case rFailed:
		return nil, s.err
	case rCommitted:
		// A sender that lost the COMMIT learns it here.
		return &header{Type: frameWelcome, Chunk: s.chunk, Window: 1, Committed: true}, nil
	case rWaiting:
		s.allocate()
		s.state = rReceiving
	}
	s.conns[rc] = struct{}{}
	s.peer = rc.peer
	w := &header{Type: frameWelcome, Chunk: s.chunk, Window: s.srv.window, Ended: s.ended}
	for _, rl := range s.layers {
		for i := range rl.parts {
			rp := &rl.parts[i]
			if rp.missing == len(rp.chunks) {
				continue
			}
			b := newBitmap(len(rp.chunks))
			for j, st := range rp.chunks {
				if st == chunkVerified {
					b.set(j)
				}
			}
			w.Done = append(w.Done, partBits{Layer: rl.L, Part: rp.want.Kind, Bits: b})
		}
	}
	return w, nil
}

func (s *rsession) detach(rc *rconn) {
	s.mu.Lock()
	delete(s.conns, rc)
	s.mu.Unlock()
}

// placement is what place decided for a DATA frame.
type placement uint8

const (
	placeClaimed   placement = iota + 1 // receive into the buffer, then verify
	placeDuplicate                      // already verified: skip and acknowledge
	placeBusy                           // being received elsewhere: skip, resend later
)

type claim struct {
	rl  *rlayer
	rp  *rpart
	idx int
}

// place checks a DATA header against the expected parts and claims its chunk.
// Any mismatch is a protocol violation by an authenticated peer.
func (s *rsession) place(h *header, n int) ([]byte, claim, placement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case rCommitted:
		return nil, claim{}, placeDuplicate, nil
	case rFailed:
		return nil, claim{}, 0, s.err
	}
	rl := s.byLayer[h.Layer]
	if rl == nil {
		return nil, claim{}, 0, s.errorf(h.Layer, "%w: layer %d is not owned by this rank (owns %v)", ErrProtocol, h.Layer, s.spec.Layers)
	}
	var rp *rpart
	pi := -1
	for i := range rl.parts {
		if rl.parts[i].want.Kind == h.Part {
			rp, pi = &rl.parts[i], i
		}
	}
	if rp == nil {
		return nil, claim{}, 0, s.errorf(h.Layer, "%w: layer %d (%s) has no part %s", ErrProtocol, h.Layer, s.spec.Model.LayerKind(h.Layer), h.Part)
	}
	w := &rp.want
	if h.DType != w.DType || !slices.Equal(h.Shape, w.Shape) {
		return nil, claim{}, 0, s.errorf(h.Layer, "%w: part %s is %s %v, expected %s %v%s", ErrProtocol, h.Part, h.DType, h.Shape, w.DType, w.Shape, s.sliceNote())
	}
	if h.Off < 0 || h.Off >= int64(rp.size) || h.Off%int64(s.chunk) != 0 {
		return nil, claim{}, 0, s.errorf(h.Layer, "%w: part %s offset %d is outside its %d bytes or off the %d-byte chunk grid", ErrProtocol, h.Part, h.Off, rp.size, s.chunk)
	}
	idx := int(h.Off / int64(s.chunk))
	off, length := chunkSpan(rp.size, s.chunk, idx)
	if h.Len != int64(length) || n != length {
		return nil, claim{}, 0, s.errorf(h.Layer, "%w: part %s chunk at %d has length %d (payload %d), expected %d", ErrProtocol, h.Part, h.Off, h.Len, n, length)
	}
	switch rp.chunks[idx] {
	case chunkVerified:
		return nil, claim{}, placeDuplicate, nil
	case chunkClaimed:
		return nil, claim{}, placeBusy, nil
	}
	rp.chunks[idx] = chunkClaimed
	dst := rl.ls.Parts[pi].Data[off : off+length]
	return dst, claim{rl, rp, idx}, placeClaimed, nil
}

// finish settles a claimed chunk: verified, or back to missing so that the
// resend can claim it. It reports whether the chunk was accepted.
func (s *rsession) finish(c claim, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != rReceiving {
		return // failed meanwhile; the buffers are gone
	}
	if !ok {
		c.rp.chunks[c.idx] = chunkMissing
		return
	}
	c.rp.chunks[c.idx] = chunkVerified
	c.rp.missing--
	c.rl.missing--
	s.missing--
	_, n := chunkSpan(c.rp.size, s.chunk, c.idx)
	s.gotBytes += int64(n)
	s.srv.bytesVerified.Add(int64(n))
	if s.missing == 0 && s.ended {
		s.commitLocked()
	}
}

// end records the sender's END after checking its totals against the spec.
func (s *rsession) end(h *header) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != rReceiving {
		return nil
	}
	var missing []int
	for _, L := range s.spec.Layers {
		if !slices.Contains(h.Sent, L) {
			missing = append(missing, L)
		}
	}
	switch {
	case len(missing) > 0:
		return s.errorf(missing[0], "%w: sender finished without layers %v (sent %v)", ErrProtocol, missing, h.Sent)
	case h.Base != s.spec.Base || h.BaseKey != s.spec.BaseKey:
		return s.errorf(-1, "%w: sender appends to a prefix of %d tokens (key %016x); this rank holds %d tokens (key %016x) for it",
			ErrProtocol, h.Base, h.BaseKey, s.spec.Base, s.spec.BaseKey)
	case h.Tokens != s.spec.Tokens || h.Layers != len(s.layers) || h.Parts != s.nParts || h.Bytes != s.wantBytes:
		return s.errorf(-1, "%w: sender finished with %d layers, %d parts, %d bytes for %d tokens; this rank expects %d layers, %d parts, %d bytes for %d tokens%s",
			ErrProtocol, h.Layers, h.Parts, h.Bytes, h.Tokens, len(s.layers), s.nParts, s.wantBytes, s.spec.Tokens, s.sliceNote())
	}
	s.ended = true
	if s.missing == 0 {
		s.commitLocked()
	}
	return nil
}

func (s *rsession) commitLocked() {
	st := &model.SeqState{Tokens: s.spec.Tokens, Layers: make([]*model.LayerState, s.spec.Model.NumLayers)}
	for _, rl := range s.layers {
		st.Layers[rl.L] = rl.ls
		rl.ls = nil
	}
	s.result = st
	s.state = rCommitted
	s.srv.committed.Add(1)
	s.finishLocked(&header{Type: frameCommit, Bytes: s.gotBytes})
}

// fail ends the session with err unless it already ended.
func (s *rsession) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == rCommitted || s.state == rFailed {
		return
	}
	s.err = err
	s.state = rFailed
	for _, rl := range s.layers {
		rl.ls = nil
	}
	s.srv.failed.Add(1)
	s.finishLocked(&header{Type: frameError, Code: errorCode(err), Msg: err.Error()})
}

// finishLocked releases the buffers' accounting, tells the connections and
// wakes Wait. The session stays known (without buffers) for Linger, so that a
// sender reconnecting after the end learns the outcome.
func (s *rsession) finishLocked(notice *header) {
	s.srv.held.Add(-s.held)
	s.held = 0
	if s.timer != nil {
		s.timer.Stop()
	}
	s.expires = time.Now().Add(s.srv.linger)
	for rc := range s.conns {
		rc.notify(notice)
	}
	close(s.done)
}

func (s *rsession) finished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == rCommitted || s.state == rFailed
}

func (s *rsession) expired(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return (s.state == rCommitted || s.state == rFailed) && now.After(s.expires)
}

// onDeadline fails the session, naming the first incomplete layer.
func (s *rsession) onDeadline() {
	s.mu.Lock()
	layer, detail := -1, "no sender authenticated"
	if s.state == rReceiving {
		detail = "all chunks verified but no END from the sender"
		for _, rl := range s.layers {
			if rl.missing == 0 {
				continue
			}
			for i := range rl.parts {
				if rp := &rl.parts[i]; rp.missing > 0 {
					layer = rl.L
					detail = fmt.Sprintf("part %s has %d of %d chunks verified", rp.want.Kind, len(rp.chunks)-rp.missing, len(rp.chunks))
					break
				}
			}
			break
		}
	} else if len(s.layers) > 0 {
		layer = s.layers[0].L
	}
	err := s.errorf(layer, "%w after %v: %s; %d of %d bytes verified", ErrDeadline,
		time.Since(s.start).Round(time.Millisecond), detail, s.gotBytes, s.wantBytes)
	s.mu.Unlock()
	s.fail(err)
}

// failf fails the session with an error built under the lock.
func (s *rsession) failf(layer int, format string, args ...any) {
	s.mu.Lock()
	err := s.errorf(layer, format, args...)
	s.mu.Unlock()
	s.fail(err)
}
