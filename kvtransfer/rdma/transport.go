// Package rdma is tandem's RDMA transport: a reliable link over the
// unreliable-connected (UC) queue pairs of Apple's Thunderbolt 5 RDMA (or
// any verbs provider), with many logical connections multiplexed over one
// long-lived link per peer.
//
// A link is a UC queue pair for data and a companion UC queue pair for
// acks, one completion queue and one page-aligned arena outside the Go
// heap, registered as one memory region and cut into fixed-size slots: a
// send ring and a receive ring of data slots, and smaller rings of 4 KiB
// ack-only slots. Every SEND fills a whole slot, as Apple's stack needs.
// Each slot carries a header with the link sequence number, the stream
// id, the fragment index and count, the length, a piggybacked cumulative
// ack and credit, and checksums. The sender holds each slot until it is
// acknowledged, retransmits from the first unacknowledged one (go-back-N)
// on a NAK or after a timeout with backoff, and fails the link after a
// bounded number of tries. The receiver drops out-of-sequence and damaged
// slots and asks again. Credits bound the slots in flight by the
// receiver's posted buffers, so the receive ring never overflows.
//
// A TCP connection bootstraps each link (queue pair numbers, GIDs, slot
// size and count, epochs; the queue pairs go to RTS, receives are posted
// and a readiness byte is exchanged) and then stays open as its liveness
// anchor: heartbeats flow both ways, and a peer that stays silent for
// DeadAfter, or closes the socket, fails the link.
//
// Frames on a stream are those of kvtransfer's Transport: a header and a
// payload. kvtransfer adapts Transport to its interface (kvtransfer.RDMA).
package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// Config configures a Transport. Zero fields take the defaults.
type Config struct {
	// Provider is the verbs implementation (sysverbs.System() or a fake).
	Provider verbs.Provider
	// Device names the device to use ("rdma_en3"). Empty: the device with a
	// GID equal to the bootstrap socket's local address.
	Device string
	// SlotSize is the bytes of each slot (default 128 KiB); both ends must
	// agree. A multiple of 4 KiB between 8 KiB and 4 MiB.
	SlotSize int
	// Slots is the number of receive slots, and of send slots, per link
	// (default 16); both ends must agree.
	Slots int
	// Reserve is how many ack-only slots of 4 KiB each side posts on the
	// link's companion queue pair (default 32); both ends must agree.
	Reserve int
	// RTO is the first retransmission timeout (default 10 ms); it doubles
	// on every expiry without progress up to MaxRTO (default 500 ms), and
	// the link fails after Retries expiries in a row (default 12).
	RTO, MaxRTO time.Duration
	Retries     int
	// AckDelay bounds how long an ack waits for a data slot to ride on
	// (default 1 ms, at most RTO/4): acks wait for company or for half a
	// window, and go alone, in a 4 KiB slot, only then.
	AckDelay time.Duration
	// Heartbeat is the interval of the anchor's heartbeats (default 100 ms);
	// a peer silent for DeadAfter (default 750 ms) is dead.
	Heartbeat, DeadAfter time.Duration
	// Handshake bounds the bootstrap (default 5 s).
	Handshake time.Duration
	// CloseWait bounds how long closing a stream waits to tell the peer
	// (default 1 s).
	CloseWait time.Duration
	// MaxLinks bounds the links a Listener holds and bootstraps at once
	// (default 16): the bootstrap is not authenticated, and each link costs
	// an arena of 2 x (Slots x SlotSize + Reserve x 4 KiB) bytes, two
	// queue pairs and a memory region (Apple allows 100 per device).
	MaxLinks int
	// MaxHeader and MaxPayload bound a frame (defaults 64 KiB and 16 MiB).
	MaxHeader, MaxPayload int
	// Logger receives link events (default none).
	Logger *zap.Logger
}

// Defaults of Config.
const (
	DefaultSlotSize = 128 << 10
	DefaultSlots    = 16
)

func (c Config) withDefaults() (Config, error) {
	set := func(p *time.Duration, d time.Duration) {
		if *p <= 0 {
			*p = d
		}
	}
	if c.SlotSize == 0 {
		c.SlotSize = DefaultSlotSize
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.Reserve == 0 {
		c.Reserve = 32
	}
	if c.Retries <= 0 {
		c.Retries = 12
	}
	set(&c.RTO, 10*time.Millisecond)
	set(&c.MaxRTO, 500*time.Millisecond)
	set(&c.AckDelay, time.Millisecond)
	c.AckDelay = min(c.AckDelay, c.RTO/4)
	set(&c.Heartbeat, 100*time.Millisecond)
	set(&c.DeadAfter, 750*time.Millisecond)
	set(&c.Handshake, 5*time.Second)
	set(&c.CloseWait, time.Second)
	if c.MaxLinks <= 0 {
		c.MaxLinks = 16
	}
	if c.MaxHeader <= 0 {
		c.MaxHeader = 64 << 10
	}
	if c.MaxPayload <= 0 {
		c.MaxPayload = 16 << 20
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	switch {
	case c.Provider == nil:
		return c, errors.New("rdma: no verbs provider")
	case c.SlotSize%verbs.Frame != 0 || c.SlotSize < minSlot || c.SlotSize > maxSlot:
		return c, fmt.Errorf("rdma: slot size %d: want a multiple of %d in %d..%d", c.SlotSize, verbs.Frame, minSlot, maxSlot)
	case c.Slots < 4 || c.Slots > maxSlots:
		return c, fmt.Errorf("rdma: %d slots: want 4..%d", c.Slots, maxSlots)
	case c.Reserve < 1 || c.Reserve > maxSlots:
		return c, fmt.Errorf("rdma: reserve of %d ack-only slots: want 1..%d", c.Reserve, maxSlots)
	}
	return c, nil
}

// Transport dials and accepts streams over RDMA links, one link per peer
// address, created on the first Dial and kept while it lives.
type Transport struct {
	cfg Config

	mu      sync.Mutex
	devs    map[string]*device
	links   map[string]*link // by the peer's bootstrap address
	dialing map[string]*sync.Mutex
	all     map[*link]bool
	closed  bool
	wg      sync.WaitGroup // link teardowns
	stats   LinkStats      // of links gone
}

type device struct {
	ctx verbs.Context
	pd  verbs.PD
}

// New returns a transport; it opens devices when links need them.
func New(cfg Config) (*Transport, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Transport{cfg: c, devs: map[string]*device{}, links: map[string]*link{}, dialing: map[string]*sync.Mutex{},
		all: map[*link]bool{}}, nil
}

// Stats sums the counters of every link, live or gone.
func (t *Transport) Stats() LinkStats {
	t.mu.Lock()
	s := t.stats
	ls := make([]*link, 0, len(t.all))
	for l := range t.all {
		ls = append(ls, l)
	}
	t.mu.Unlock()
	for _, l := range ls {
		l.mu.Lock()
		s.add(l.stats)
		l.unlock()
	}
	return s
}

// Close fails every link and waits until they are torn down.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	ls := make([]*link, 0, len(t.all))
	for l := range t.all {
		ls = append(ls, l)
	}
	t.mu.Unlock()
	for _, l := range ls {
		l.closeLink()
	}
	t.wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, d := range t.devs {
		d.pd.Close()
		d.ctx.Close()
		delete(t.devs, name)
	}
	return nil
}

// Conn is a stream: a logical connection over a link. It has the methods
// of kvtransfer.Conn.
type Conn struct {
	*stream
	local, remote string
}

func (c *Conn) LocalAddr() string  { return c.local }
func (c *Conn) RemoteAddr() string { return c.remote }

// Dial opens a stream to the listener at addr, bootstrapping a link to it
// first if there is none.
func (t *Transport) Dial(ctx context.Context, addr string) (*Conn, error) {
	l, err := t.linkTo(ctx, addr)
	if err != nil {
		return nil, err
	}
	s, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	return &Conn{stream: s, local: l.anchorLocal, remote: addr}, nil
}

func (t *Transport) linkTo(ctx context.Context, addr string) (*link, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	mu := t.dialing[addr]
	if mu == nil {
		mu = &sync.Mutex{}
		t.dialing[addr] = mu
	}
	t.mu.Unlock()
	// One bootstrap per peer at a time; the others then share its link.
	mu.Lock()
	defer mu.Unlock()
	t.mu.Lock()
	l := t.links[addr]
	t.mu.Unlock()
	if l != nil && l.alive() {
		return l, nil
	}
	d := net.Dialer{}
	hctx, cancel := context.WithTimeout(ctx, t.cfg.Handshake)
	defer cancel()
	c, err := d.DialContext(hctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma: bootstrap %s: %w", addr, err)
	}
	l, err = t.bootstrap(hctx, c, addr, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	t.mu.Lock()
	t.links[addr] = l
	t.mu.Unlock()
	return l, nil
}

func (l *link) alive() bool {
	l.mu.Lock()
	defer l.unlock()
	return l.err == nil
}

// open starts a stream: a sequenced OPEN slot tells the listener.
func (l *link) open(ctx context.Context) (*stream, error) {
	l.mu.Lock()
	defer l.unlock()
	for {
		if l.err != nil {
			return nil, l.err
		}
		l.nextStream++
		id := l.nextStream
		if l.sendSequenced(kindOpen, id) {
			s := newStream(l, id)
			l.streams[id] = s
			return s, nil
		}
		l.nextStream--
		ch := l.changed
		l.unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			l.mu.Lock()
			return nil, ctx.Err()
		}
		l.mu.Lock()
	}
}

// closeLink says goodbye on the anchor and fails the link.
func (l *link) closeLink() {
	l.mu.Lock()
	a := l.anchor
	alive := l.err == nil
	l.unlock()
	if alive && a != nil {
		a.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		a.Write([]byte{anchorBye})
	}
	l.fail(fmt.Errorf("rdma: link to %s: %w", l.name, ErrClosed))
}

// Listener accepts streams over links that peers bootstrap to it.
type Listener struct {
	t      *Transport
	ln     net.Listener
	accept chan *stream
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	links  map[*link]bool
	held   int // links held and bootstraps under way
}

// Listen accepts link bootstraps on addr ("host:port") and streams over
// them. As everywhere in tandem, an address beyond loopback carries only
// authenticated sessions: kvtransfer's handshake runs over every stream.
func (t *Transport) Listen(addr string) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma: listen %s: %w", addr, err)
	}
	return t.ListenOn(ln), nil
}

// ListenOn accepts link bootstraps from ln (a port shared with another
// protocol hands over the connections that start with BootstrapMagic);
// closing the Listener closes ln.
func (t *Transport) ListenOn(ln net.Listener) *Listener {
	L := &Listener{t: t, ln: ln, accept: make(chan *stream, 256), done: make(chan struct{}), links: map[*link]bool{}}
	L.wg.Add(1)
	go L.serve()
	return L
}

func (L *Listener) serve() {
	defer L.wg.Done()
	for {
		c, err := L.ln.Accept()
		if err != nil {
			return
		}
		L.wg.Add(1)
		go func() {
			defer L.wg.Done()
			L.ServeConn(c)
		}()
	}
}

// admit counts a connection against MaxLinks; false: refuse it.
func (L *Listener) admit() bool {
	L.mu.Lock()
	defer L.mu.Unlock()
	if L.held >= L.t.cfg.MaxLinks {
		return false
	}
	L.held++
	return true
}

func (L *Listener) release() {
	L.mu.Lock()
	L.held--
	L.mu.Unlock()
}

// ServeConn bootstraps a link over c, a connection accepted elsewhere
// (for a port shared with another protocol), and serves it.
func (L *Listener) ServeConn(c net.Conn) {
	if !L.admit() {
		L.t.cfg.Logger.Warn("rdma: bootstrap refused: listener holds its most links", zap.String("peer", c.RemoteAddr().String()),
			zap.Int("max_links", L.t.cfg.MaxLinks))
		c.Close()
		return
	}
	// Released before the connection closes on a refusal: a peer that
	// sees the close may dial again at once and must find the slot free.
	var once sync.Once
	release := func() { once.Do(L.release) }
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), L.t.cfg.Handshake)
	stop := context.AfterFunc(ctx, func() {
		select {
		case <-L.done:
			c.Close()
		default:
		}
	})
	go func() {
		select {
		case <-L.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	l, err := L.t.bootstrap(ctx, c, c.RemoteAddr().String(), L.accept)
	stop()
	cancel()
	if err != nil {
		L.t.cfg.Logger.Warn("rdma: bootstrap refused", zap.String("peer", c.RemoteAddr().String()), zap.Error(err))
		release()
		c.Close()
		return
	}
	L.mu.Lock()
	select {
	case <-L.done:
		L.mu.Unlock()
		l.closeLink()
		return
	default:
	}
	L.links[l] = true
	L.mu.Unlock()
	<-l.done
	L.mu.Lock()
	delete(L.links, l)
	L.mu.Unlock()
}

// Accept waits for a stream a peer opened.
func (L *Listener) Accept() (*Conn, error) {
	select {
	case s := <-L.accept:
		return &Conn{stream: s, local: L.Addr(), remote: s.l.name}, nil
	case <-L.done:
		return nil, fmt.Errorf("rdma: accept on %s: %w", L.Addr(), ErrClosed)
	}
}

// Addr is the bootstrap address.
func (L *Listener) Addr() string { return L.ln.Addr().String() }

// Close stops accepting and closes the links bootstrapped through it.
func (L *Listener) Close() error {
	L.once.Do(func() {
		close(L.done)
		L.ln.Close()
		L.mu.Lock()
		ls := make([]*link, 0, len(L.links))
		for l := range L.links {
			ls = append(ls, l)
		}
		L.mu.Unlock()
		for _, l := range ls {
			l.closeLink()
		}
		L.wg.Wait()
		for {
			select {
			case s := <-L.accept:
				s.Close()
				continue
			default:
			}
			break
		}
	})
	return nil
}

// The bootstrap message, both ways, little-endian:
//
//	0 u32 magic "TDRB", 4 u16 version, 6 u16 MTU (ibv_mtu), 8 [16]byte GID,
//	24 u32 QPN, 28 u32 PSN, 32 u32 slot size, 36 u32 slots, 40 u32 reserve,
//	44 u32 epoch, 48 u32 companion QPN, 52 u32 companion PSN, 56..64 zero
//
// then one readiness byte each way once receives are posted. Afterwards the
// socket carries heartbeat bytes, and a goodbye byte before a local close.
const (
	bootMagic   = 0x42524454 // "TDRB"
	bootVersion = 2          // 2: the companion queue pair
	bootSize    = 64
	anchorReady = 'R'
	anchorBeat  = 'h'
	anchorBye   = 'b'
)

// BootstrapMagic is the first four bytes a link bootstrap sends, for a
// listener that shares its port with another protocol.
var BootstrapMagic = [4]byte{'T', 'D', 'R', 'B'}

type bootMsg struct {
	mtu                  verbs.MTU
	gid                  verbs.GID
	qpn, psn             uint32
	slot, slots, reserve uint32
	epoch                uint32
	cqpn, cpsn           uint32 // the companion pair's
}

func (m *bootMsg) encode() []byte {
	b := make([]byte, bootSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], bootMagic)
	le.PutUint16(b[4:], bootVersion)
	le.PutUint16(b[6:], uint16(m.mtu))
	copy(b[8:24], m.gid[:])
	le.PutUint32(b[24:], m.qpn)
	le.PutUint32(b[28:], m.psn)
	le.PutUint32(b[32:], m.slot)
	le.PutUint32(b[36:], m.slots)
	le.PutUint32(b[40:], m.reserve)
	le.PutUint32(b[44:], m.epoch)
	le.PutUint32(b[48:], m.cqpn)
	le.PutUint32(b[52:], m.cpsn)
	return b
}

func decodeBoot(b []byte) (m bootMsg, err error) {
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != bootMagic {
		return m, errors.New("not an RDMA link bootstrap")
	}
	if v := le.Uint16(b[4:]); v != bootVersion {
		return m, fmt.Errorf("bootstrap version %d, want %d", v, bootVersion)
	}
	m.mtu = verbs.MTU(le.Uint16(b[6:]))
	copy(m.gid[:], b[8:24])
	m.qpn, m.psn = le.Uint32(b[24:]), le.Uint32(b[28:])
	m.slot, m.slots, m.reserve, m.epoch = le.Uint32(b[32:]), le.Uint32(b[36:]), le.Uint32(b[40:]), le.Uint32(b[44:])
	m.cqpn, m.cpsn = le.Uint32(b[48:]), le.Uint32(b[52:])
	return m, nil
}

// choice is the device, port and GID a link uses.
type choice struct {
	dev      *device
	name     string
	port     int
	gidIndex int
	gid      verbs.GID
	mtu      verbs.MTU
}

// choose picks the configured device, or the one with a GID equal to ip,
// on an ACTIVE port.
func (t *Transport) choose(ip net.IP) (choice, error) {
	names := []string{t.cfg.Device}
	if t.cfg.Device == "" {
		var err error
		if names, err = t.cfg.Provider.Devices(); err != nil {
			return choice{}, fmt.Errorf("rdma: list devices: %w", err)
		}
		if len(names) == 0 {
			return choice{}, fmt.Errorf("rdma: %w: the library lists none", verbs.ErrNoDevice)
		}
	}
	want := verbs.GIDFromIP(ip)
	var reasons []string
	for _, name := range names {
		d, err := t.device(name)
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		for port := 1; port <= 2; port++ {
			pa, err := d.ctx.QueryPort(port)
			if err != nil {
				break
			}
			if pa.State != verbs.PortActive {
				reasons = append(reasons, fmt.Sprintf("%s port %d is %s", name, port, pa.State))
				continue
			}
			for i := 0; i < min(pa.GIDTableLen, 16); i++ {
				g, err := d.ctx.QueryGID(port, i)
				if err != nil || g.IsZero() {
					continue
				}
				if g == want {
					return choice{dev: d, name: name, port: port, gidIndex: i, gid: g, mtu: pa.ActiveMTU}, nil
				}
			}
			reasons = append(reasons, fmt.Sprintf("%s port %d has no GID %s", name, port, ip))
		}
	}
	return choice{}, fmt.Errorf("rdma: %w for local address %s: %v", verbs.ErrNoDevice, ip, reasons)
}

func (t *Transport) device(name string) (*device, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d := t.devs[name]; d != nil {
		return d, nil
	}
	ctx, err := t.cfg.Provider.Open(name)
	if err != nil {
		return nil, fmt.Errorf("rdma: open %s: %w", name, err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		ctx.Close()
		return nil, fmt.Errorf("rdma: %s: alloc_pd: %w", name, err)
	}
	d := &device{ctx: ctx, pd: pd}
	t.devs[name] = d
	return d, nil
}

// Probe reports why the transport cannot run over ip's device, or nil.
func (t *Transport) Probe(ip net.IP) error {
	_, err := t.choose(ip)
	return err
}

// bootstrap builds a link over the TCP connection c: the queue pair,
// arena and region, the exchange, RTR, RTS, posted receives and the
// readiness byte. accept is nil on the dialing side.
func (t *Transport) bootstrap(ctx context.Context, c net.Conn, peer string, accept chan *stream) (_ *link, err error) {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	local := c.LocalAddr().(*net.TCPAddr)
	cfg := &t.cfg
	nslots := cfg.Slots
	// The listening side reads the dialer's message before it allocates
	// anything: a connection that is not a link bootstrap, or one of
	// another geometry, costs it no queue pair, arena or memory region.
	var early []byte
	if accept != nil {
		early = make([]byte, bootSize)
		if _, err := io.ReadFull(c, early); err != nil {
			return nil, fmt.Errorf("rdma: bootstrap with %s: %w", peer, err)
		}
		pm, err := decodeBoot(early)
		if err != nil {
			return nil, fmt.Errorf("rdma: bootstrap with %s: %w", peer, err)
		}
		if int(pm.slot) != cfg.SlotSize || int(pm.slots) != nslots || int(pm.reserve) != cfg.Reserve {
			return nil, fmt.Errorf("rdma: bootstrap with %s: peer has %d slots of %d bytes (reserve %d), we have %d of %d (reserve %d)",
				peer, pm.slots, pm.slot, pm.reserve, nslots, cfg.SlotSize, cfg.Reserve)
		}
	}
	ch, err := t.choose(local.IP)
	if err != nil {
		return nil, err
	}
	frames := nslots * verbs.Frames(cfg.SlotSize)
	nctl := cfg.Reserve
	// Every posted request of both pairs can complete before a poll.
	cq, err := ch.dev.ctx.CreateCQ(2*nslots + 2*nctl + 16)
	if err != nil {
		return nil, fmt.Errorf("rdma: %s: create_cq: %w", ch.name, err)
	}
	qp, err := ch.dev.pd.CreateQP(verbs.QPInit{SendCQ: cq, RecvCQ: cq, MaxSendWR: frames, MaxRecvWR: frames})
	if err != nil {
		cq.Close()
		return nil, fmt.Errorf("rdma: %s: create_qp: %w", ch.name, err)
	}
	cqp, err := ch.dev.pd.CreateQP(verbs.QPInit{SendCQ: cq, RecvCQ: cq, MaxSendWR: nctl * verbs.Frames(ctlSlot), MaxRecvWR: nctl * verbs.Frames(ctlSlot)})
	if err != nil {
		qp.Close()
		cq.Close()
		return nil, fmt.Errorf("rdma: %s: create_qp (companion): %w", ch.name, err)
	}
	dataBytes := 2 * nslots * cfg.SlotSize
	arena, err := mapArena(dataBytes + 2*nctl*ctlSlot)
	if err != nil {
		qp.Close()
		cqp.Close()
		cq.Close()
		return nil, err
	}
	mr, err := ch.dev.pd.RegMR(arena, verbs.AccessDefault)
	if err != nil {
		qp.Close()
		cqp.Close()
		cq.Close()
		unmapArena(arena)
		return nil, fmt.Errorf("rdma: %s: reg_mr of %d bytes: %w", ch.name, len(arena), err)
	}
	undo := func() {
		qp.Close()
		cqp.Close()
		cq.Close()
		mr.Close()
		unmapArena(arena)
	}
	epoch := rand.Uint32() | 1
	me := bootMsg{mtu: ch.mtu, gid: ch.gid, qpn: qp.Num(), psn: epoch & 0xffffff, slot: uint32(cfg.SlotSize),
		slots: uint32(nslots), reserve: uint32(cfg.Reserve), epoch: epoch, cqpn: cqp.Num(), cpsn: (epoch >> 8) & 0xffffff}
	var pm bootMsg
	if early != nil {
		pm, _ = decodeBoot(early) // checked above
		_, err = c.Write(me.encode())
	} else {
		err = exchange(c, me.encode(), func(b []byte) error { var err error; pm, err = decodeBoot(b); return err })
	}
	if err != nil {
		undo()
		return nil, fmt.Errorf("rdma: bootstrap with %s: %w", peer, err)
	}
	if pm.slot != me.slot || pm.slots != me.slots || pm.reserve != me.reserve {
		undo()
		return nil, fmt.Errorf("rdma: bootstrap with %s: peer has %d slots of %d bytes (reserve %d), we have %d of %d (reserve %d)",
			peer, pm.slots, pm.slot, pm.reserve, me.slots, me.slot, me.reserve)
	}
	mtu := min(me.mtu, pm.mtu)
	for _, p := range []struct {
		name           string
		qp             verbs.QP
		dest, psn, rts uint32
	}{{"", qp, pm.qpn, pm.psn, me.psn}, {" (companion)", cqp, pm.cqpn, pm.cpsn, me.cpsn}} {
		steps := []func() error{
			func() error { return p.qp.Init(ch.port) },
			func() error {
				return p.qp.ReadyToReceive(verbs.RTR{Port: ch.port, MTU: mtu, DestQPN: p.dest, RemotePSN: p.psn, DGID: pm.gid, SGIDIndex: ch.gidIndex})
			},
			func() error { return p.qp.ReadyToSend(p.rts) },
		}
		for i, step := range steps {
			if err := step(); err != nil {
				undo()
				return nil, fmt.Errorf("rdma: bootstrap with %s: %s%s: %w", peer, []string{"INIT", "RTR", "RTS"}[i], p.name, err)
			}
		}
	}
	l := &link{cfg: cfg, name: peer, qp: qp, cqp: cqp, cq: cq, mr: mr, arena: arena, anchor: c, slot: cfg.SlotSize,
		capacity: cfg.SlotSize - hdrSize, epoch: epoch, peer: pm.epoch, ctl: nctl, win: nslots,
		nextSeq: 1, postNext: 1, maxPosted: 1, expected: 1, rto: cfg.RTO, streams: map[uint32]*stream{},
		accept: accept, changed: make(chan struct{}), done: make(chan struct{}), anchorLocal: local.String()}
	l.peerCredit = uint64(l.win)
	l.ackSent, l.creditSent = 0, uint64(l.win)
	l.ready = make([]bool, l.win)
	l.inflight = make([]bool, l.win)
	l.packed = make([]bool, l.win)
	l.sentAt = make([]time.Time, l.win)
	l.resent = make([]bool, l.win)
	l.ctlBusy = make([]bool, l.ctl)
	// The arena: data send ring, data receive ring, then the companion
	// pair's send and receive rings.
	at := func(i int) []byte { return arena[i*cfg.SlotSize : (i+1)*cfg.SlotSize] }
	atCtl := func(i int) []byte { return arena[dataBytes+i*ctlSlot : dataBytes+(i+1)*ctlSlot] }
	for i := 0; i < nslots; i++ {
		l.sendData = append(l.sendData, at(i))
		l.recv = append(l.recv, at(nslots+i))
	}
	for i := 0; i < nctl; i++ {
		l.sendCtl = append(l.sendCtl, atCtl(i))
		l.recvCtl = append(l.recvCtl, atCtl(nctl+i))
	}
	// Receives only after RTS; SENDs only after the peer says its
	// receives are posted.
	if err := l.startPosting(); err != nil {
		undo()
		return nil, err
	}
	if err := exchange(c, []byte{anchorReady}, func(b []byte) error {
		if b[0] != anchorReady {
			return fmt.Errorf("readiness byte %#x", b[0])
		}
		return nil
	}); err != nil {
		undo()
		return nil, fmt.Errorf("rdma: bootstrap with %s: %w", peer, err)
	}
	c.SetDeadline(time.Time{})
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		undo()
		return nil, ErrClosed
	}
	t.all[l] = true
	t.wg.Add(1)
	t.mu.Unlock()
	l.onDown = func(l *link) {
		t.mu.Lock()
		defer t.mu.Unlock()
		delete(t.all, l)
		if t.links[l.name] == l {
			delete(t.links, l.name)
		}
		t.stats.add(l.stats)
	}
	l.run()
	go func() {
		defer t.wg.Done()
		<-l.done
		l.teardown()
	}()
	cfg.Logger.Info("rdma: link up", zap.String("peer", peer), zap.String("device", ch.name), zap.Int("port", ch.port),
		zap.Stringer("gid", ch.gid), zap.Uint32("qpn", me.qpn), zap.Uint32("peer_qpn", pm.qpn), zap.Int("slot", cfg.SlotSize),
		zap.Int("slots", nslots))
	return l, nil
}

// exchange writes mine and reads the peer's message of the same length.
func exchange(c net.Conn, mine []byte, check func([]byte) error) error {
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(mine)
		werr <- err
	}()
	b := make([]byte, len(mine))
	_, rerr := io.ReadFull(c, b)
	if err := <-werr; err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	return check(b)
}

func (l *link) startPosting() error {
	for i := range l.recv {
		if err := l.qp.PostRecv(idRecv|uint64(i), l.mr, l.recv[i]); err != nil {
			return fmt.Errorf("rdma: post receive %d: %w", i, err)
		}
	}
	for i := range l.recvCtl {
		if err := l.cqp.PostRecv(idCtlRecv|uint64(i), l.mr, l.recvCtl[i]); err != nil {
			return fmt.Errorf("rdma: post ack receive %d: %w", i, err)
		}
	}
	return nil
}

// run starts the poller and the anchor.
func (l *link) run() {
	l.pollerDone = make(chan struct{})
	l.anchorOut = make(chan struct{})
	go l.poll()
	go l.watchAnchor()
}

// watchAnchor sends heartbeats and fails the link when the peer's stop
// for DeadAfter or the socket closes.
func (l *link) watchAnchor() {
	defer close(l.anchorOut)
	c := l.anchor
	beat := make(chan struct{})
	go func() {
		defer close(beat)
		tk := time.NewTicker(l.cfg.Heartbeat)
		defer tk.Stop()
		for {
			select {
			case <-l.done:
				return
			case <-tk.C:
				c.SetWriteDeadline(time.Now().Add(l.cfg.DeadAfter))
				if _, err := c.Write([]byte{anchorBeat}); err != nil {
					l.fail(fmt.Errorf("rdma: link to %s: %w: anchor: %v", l.name, ErrPeerDead, err))
					return
				}
			}
		}
	}()
	var b [64]byte
	for {
		c.SetReadDeadline(time.Now().Add(l.cfg.DeadAfter))
		n, err := c.Read(b[:])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				err = fmt.Errorf("no heartbeat for %v", l.cfg.DeadAfter)
			}
			l.fail(fmt.Errorf("rdma: link to %s: %w: anchor: %v", l.name, ErrPeerDead, err))
			break
		}
		for _, x := range b[:n] {
			if x == anchorBye {
				l.fail(fmt.Errorf("rdma: link to %s: %w", l.name, ErrPeerClosed))
			}
		}
	}
	c.Close()
	<-beat
}
