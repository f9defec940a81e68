package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/kvtransfer"
)

// Dir tells a rank's two links apart.
type Dir uint8

const (
	Upstream   Dir = iota + 1 // from the previous rank (accepted)
	Downstream                // to the next rank (dialed)
)

func (d Dir) String() string {
	if d == Upstream {
		return "upstream"
	}
	return "downstream"
}

// Config configures one rank's side of the ring.
type Config struct {
	Group string
	Rank  int
	Ranks int
	// Server is the rank's kvtransfer server: the previous rank's channel is
	// accepted on it.
	Server *kvtransfer.Server
	// Next is the next rank's endpoint (rank 0's for the last rank).
	Next string
	// Secret authenticates the group's channels (at least 16 bytes).
	Secret []byte
	// Transport dials the next rank (default TCP).
	Transport kvtransfer.Transport
	// Timeouts bound the channel handshake and each frame write.
	Timeouts kvtransfer.Timeouts
	// Heartbeat is how often an idle link sends a keep-alive (default 500 ms);
	// Idle is how long a link may stay silent before it is taken for dead
	// (default 3 s, at least twice Heartbeat).
	Heartbeat, Idle time.Duration
	// MaxFrame bounds one frame's payload (default 4 MiB); MaxMessage one
	// message's (default 1 GiB).
	MaxFrame   int
	MaxMessage int64
	// Early, when set, sees each message from the previous rank on the
	// link's reader as it arrives, before it is queued behind those not yet
	// taken from Events (which still delivers it): what must act while the
	// rank is busy, such as a cancellation, acts there. It must not block.
	Early func(*Msg)
	Log   *zap.Logger
}

// ChannelID is the id under which rank r accepts its previous rank.
func ChannelID(group string, r int) string { return fmt.Sprintf("%s/mesh/%d", group, r) }

func (c *Config) setDefaults() error {
	switch {
	case c.Ranks < 2 || c.Rank < 0 || c.Rank >= c.Ranks:
		return fmt.Errorf("mesh: rank %d of %d: a ring needs two ranks at least", c.Rank, c.Ranks)
	case c.Server == nil:
		return fmt.Errorf("mesh: rank %d: no kvtransfer server", c.Rank)
	case c.Next == "":
		return fmt.Errorf("mesh: rank %d: no next endpoint", c.Rank)
	case len(c.Secret) < 16:
		return fmt.Errorf("mesh: group %q: the secret has %d bytes, at least 16 needed", c.Group, len(c.Secret))
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 500 * time.Millisecond
	}
	if c.Idle <= 0 {
		c.Idle = 3 * time.Second
	}
	if c.Idle < 2*c.Heartbeat {
		return fmt.Errorf("mesh: idle timeout %v must be at least twice the heartbeat %v", c.Idle, c.Heartbeat)
	}
	if c.MaxFrame <= 0 {
		c.MaxFrame = 4 << 20
	}
	c.MaxFrame = min(c.MaxFrame, kvtransfer.MaxChunkSize)
	if c.MaxMessage <= 0 {
		c.MaxMessage = 1 << 30
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	return nil
}

// Event is a message (from the previous rank, or a reset from the next
// one), or a link going up or down.
type Event struct {
	Msg *Msg // nil for a link event
	Dir Dir
	Up  bool
	Err error  // why a link went down
	Gen uint64 // the link's generation, increasing per rank
}

// Ring is one rank's two links. It keeps them up: it accepts the previous
// rank whenever it (re)connects and redials the next rank until it answers.
type Ring struct {
	cfg    Config
	events chan Event
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	up   *link
	down *link
	gen  uint64
}

// Start starts accepting and dialing. Events arrive on Events until Close.
func Start(cfg Config) (*Ring, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	r := &Ring{cfg: cfg, events: make(chan Event, 256)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(2)
	go r.acceptLoop()
	go r.dialLoop()
	return r, nil
}

// Events delivers messages from the previous rank in order, and link
// changes. It is never closed; stop reading after Close.
func (r *Ring) Events() <-chan Event { return r.events }

// Send queues a message to the next rank. It does not block; it fails when
// the link is down (the message is dropped).
func (r *Ring) Send(h *Header, payload []byte) error {
	r.mu.Lock()
	l := r.down
	r.mu.Unlock()
	if l == nil {
		return ErrLinkDown
	}
	return l.send(h, payload)
}

// SendUp queues a message to the previous rank, against the ring's
// direction: only resets travel that way.
func (r *Ring) SendUp(h *Header, payload []byte) error {
	r.mu.Lock()
	l := r.up
	r.mu.Unlock()
	if l == nil {
		return ErrLinkDown
	}
	return l.send(h, payload)
}

// DropDownstream closes the link to the next rank (it is redialed), e.g.
// after the next rank broke the protocol.
func (r *Ring) DropDownstream(reason error) {
	r.mu.Lock()
	l := r.down
	r.mu.Unlock()
	if l != nil {
		l.fail(reason)
	}
}

// DropUpstream closes the link from the previous rank; it reconnects.
func (r *Ring) DropUpstream(reason error) {
	r.mu.Lock()
	l := r.up
	r.mu.Unlock()
	if l != nil {
		l.fail(reason)
	}
}

// Close stops both links and the loops. What was sent before is delivered
// first: each link says goodbye and waits for the peer to close its end.
func (r *Ring) Close() error {
	r.cancel()
	r.wg.Wait() // the loops and watchers return on the canceled context
	r.mu.Lock()
	ls := []*link{r.down, r.up}
	r.up, r.down = nil, nil
	r.mu.Unlock()
	// Say goodbye downstream first (where this rank's results go), then
	// upstream, so that the neighbours see the results before either link
	// goes down; a peer that does not close within the idle timeout is
	// closed on anyway.
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Idle)
	defer cancel()
	for _, l := range ls {
		if l != nil {
			l.leave(ctx)
			l.close(errors.New("ring closed"))
		}
	}
	return nil
}

func (r *Ring) emit(ev Event) bool {
	select {
	case r.events <- ev:
		return true
	case <-r.ctx.Done():
		return false
	}
}

func (r *Ring) nextGen() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	return r.gen
}

// acceptLoop accepts the previous rank's channel, again and again: a new
// channel replaces the current one (the previous rank restarted).
func (r *Ring) acceptLoop() {
	defer r.wg.Done()
	id := ChannelID(r.cfg.Group, r.cfg.Rank)
	for r.ctx.Err() == nil {
		ch, err := r.cfg.Server.AcceptChannel(r.ctx, id, r.cfg.Secret)
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			r.cfg.Log.Warn("mesh: accept from the previous rank failed", zap.Error(err))
			r.sleep(200 * time.Millisecond)
			continue
		}
		gen := r.nextGen()
		var l *link
		l = newLink(ch, Upstream, gen, &r.cfg, func(m *Msg) bool {
			if r.cfg.Early != nil {
				r.cfg.Early(m)
			}
			return r.emit(Event{Msg: m, Dir: Upstream, Gen: gen})
		})
		r.mu.Lock()
		old := r.up
		r.up = l
		r.mu.Unlock()
		if old != nil {
			// The previous rank reconnected before its old link was seen to
			// die (it restarted): report the old link down first, so that
			// this rank drops what it held for the old ring.
			err := errors.New("replaced by a new connection from the previous rank")
			old.close(err)
			if !r.emit(Event{Dir: Upstream, Err: err, Gen: old.gen}) {
				return
			}
		}
		r.cfg.Log.Info("mesh: previous rank connected", zap.String("peer", ch.RemoteAddr()), zap.Uint64("gen", gen))
		if !r.emit(Event{Dir: Upstream, Up: true, Gen: gen}) {
			return
		}
		r.wg.Add(1)
		go r.watch(l, Upstream, gen)
	}
}

// watch reports the link's death, unless it was replaced meanwhile.
func (r *Ring) watch(l *link, d Dir, gen uint64) {
	defer r.wg.Done()
	select {
	case <-l.dead:
	case <-r.ctx.Done():
		return
	}
	r.mu.Lock()
	current := false
	if d == Upstream && r.up == l {
		r.up, current = nil, true
	}
	if d == Downstream && r.down == l {
		r.down, current = nil, true
	}
	r.mu.Unlock()
	l.wg.Wait()
	if current {
		err := l.cause()
		r.cfg.Log.Warn("mesh: link down", zap.Stringer("dir", d), zap.Uint64("gen", gen), zap.Error(err))
		r.emit(Event{Dir: d, Err: err, Gen: gen})
	}
}

// dialLoop keeps a channel to the next rank, redialing with backoff.
func (r *Ring) dialLoop() {
	defer r.wg.Done()
	id := ChannelID(r.cfg.Group, (r.cfg.Rank+1)%r.cfg.Ranks)
	backoff := 50 * time.Millisecond
	for r.ctx.Err() == nil {
		ch, err := kvtransfer.DialChannel(r.ctx, kvtransfer.ChannelConfig{Transport: r.cfg.Transport, Addr: r.cfg.Next,
			ID: id, Secret: r.cfg.Secret, Timeouts: r.cfg.Timeouts})
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			r.cfg.Log.Debug("mesh: next rank not reachable yet", zap.String("addr", r.cfg.Next), zap.Error(err))
			r.sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		gen := r.nextGen()
		l := newLink(ch, Downstream, gen, &r.cfg, func(m *Msg) bool {
			return r.emit(Event{Msg: m, Dir: Downstream, Gen: gen})
		})
		r.mu.Lock()
		r.down = l
		r.mu.Unlock()
		r.cfg.Log.Info("mesh: connected to the next rank", zap.String("addr", r.cfg.Next), zap.Uint64("gen", gen))
		if !r.emit(Event{Dir: Downstream, Up: true, Gen: gen}) {
			return
		}
		r.wg.Add(1)
		r.watch(l, Downstream, gen) // blocks until the link dies
	}
}

func (r *Ring) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.ctx.Done():
	}
}
