// Package fakeverbs is an in-process verbs fabric with the semantics of
// Apple's Thunderbolt 5 RDMA as far as tandem relies on them, for tests and
// benchmarks on machines without RDMA hardware:
//
//   - UC queue pairs only; posting a SEND before RTS is an error.
//   - A SEND consumes the head posted RECV of the peer queue pair, in order.
//     The SEND must fill exactly as many 4 KiB frames as that RECV; if not,
//     the receiver gets a local-length-error completion and the message is
//     lost. With no posted RECV the message is dropped (or, in NoRecvBlock
//     mode, waits for one, as hardware credits might make it).
//   - Completions are local only: a send completion means the message left
//     (its buffer was read and may be reused), never that it arrived.
//   - Limits: posted receives and sends are counted in 4 KiB frames against
//     the queue pair's MaxRecvWR and MaxSendWR; at most 100 memory regions
//     per device, page-aligned, with remote access flags; a completion queue
//     that overflows fails.
//   - Faults: random loss, loss of chosen messages, tail loss (the last
//     message of every burst), delay, bit flips, a silent dead host (its
//     messages vanish, nothing errors) and a pulled link (posts fail).
package fakeverbs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// MaxMR is the number of memory regions a device allows (Apple's limit).
const MaxMR = 100

// DeviceName is the name of every fake host's single device.
const DeviceName = "rdma_en0"

// NoRecv is what a SEND meets when the peer has no RECV posted.
type NoRecv int

const (
	// NoRecvDrop drops the message silently (UC).
	NoRecvDrop NoRecv = iota
	// NoRecvBlock holds it until a RECV is posted.
	NoRecvBlock
)

// Faults are injected into messages on the wire. Message numbers count every
// SEND on the fabric from 1.
type Faults struct {
	// Loss is the probability that a message is lost.
	Loss float64
	// LoseNth lists message numbers to lose.
	LoseNth []int64
	// TailLoss, when positive, loses the last message of every burst: a
	// message after which its sender posts nothing for TailLoss.
	TailLoss time.Duration
	// Delay delays every message one way, in order.
	Delay time.Duration
	// Flip is the probability that a delivered message has one bit flipped.
	Flip float64
	// MaxFaults stops injecting losses and flips after this many (0: never).
	MaxFaults int64
	// From limits the faults to messages sent by this host ("" means all).
	From string
	// Bytes, when positive, limits Loss, LoseNth and Flip to messages of
	// exactly this many bytes (4096: a link's ack-only slots).
	Bytes int
	// NoRecv chooses what a SEND with no posted RECV does.
	NoRecv NoRecv
	// After message SilenceAfter, host Silence goes silent (Fabric.Silence);
	// after message PullAfter, host Pull's cable is pulled (Fabric.Pull).
	SilenceAfter, PullAfter int64
	Silence, Pull           string
}

// Stats count what happened on the wire.
type Stats struct {
	Sent, Delivered         int64
	Lost, TailLost, Flipped int64
	NoRecvDrops, LenErrors  int64
	Silenced                int64
}

// Fabric connects fake hosts. It is safe for concurrent use.
type Fabric struct {
	mu      sync.Mutex
	faults  Faults
	rng     *rand.Rand
	stats   Stats
	nextQPN uint32
	qps     map[uint32]*qp
	hosts   map[string]*host
}

// NewFabric returns a fabric injecting faults, random in seed.
func NewFabric(f Faults, seed uint64) *Fabric {
	return &Fabric{faults: f, rng: rand.New(rand.NewPCG(seed, 0x5eed)), nextQPN: 0x100,
		qps: map[uint32]*qp{}, hosts: map[string]*host{}}
}

// SetFaults replaces the faults (the message count goes on).
func (f *Fabric) SetFaults(fl Faults) {
	f.mu.Lock()
	f.faults = fl
	f.mu.Unlock()
}

// Stats returns the counters so far.
func (f *Fabric) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

type host struct {
	name   string
	gid    verbs.GID
	silent bool // dead without a word: its messages and those to it vanish
	pulled bool // cable out: its posts fail
	mrs    int
	down   bool // port reported DOWN
}

// Host returns the provider of host name, creating it with one device whose
// GID table holds a link-local GID at index 0 and gid at index 1.
func (f *Fabric) Host(name string, gid verbs.GID) verbs.Provider {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.hosts[name]
	if !ok {
		h = &host{name: name, gid: gid}
		f.hosts[name] = h
	}
	return &provider{f: f, h: h}
}

// MRs is how many memory regions host has registered now.
func (f *Fabric) MRs(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hosts[name]; h != nil {
		return h.mrs
	}
	return 0
}

func (f *Fabric) host(name string) *host {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hosts[name]
}

// Silence makes host a silent dead peer: everything it sends and everything
// sent to it vanishes, and nothing reports an error.
func (f *Fabric) Silence(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hosts[name]; h != nil {
		h.silent = true
	}
}

// Pull pulls host's cable: its posts fail and messages to it vanish.
func (f *Fabric) Pull(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hosts[name]; h != nil {
		h.pulled = true
	}
}

// PortDown reports host's port DOWN (as a Thunderbolt 4 Mac or an unplugged
// port does).
func (f *Fabric) PortDown(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.hosts[name]; h != nil {
		h.down = true
	}
}

type provider struct {
	f *Fabric
	h *host
}

func (p *provider) Devices() ([]string, error) { return []string{DeviceName}, nil }

func (p *provider) Open(name string) (verbs.Context, error) {
	if name != DeviceName {
		return nil, fmt.Errorf("fakeverbs: no device %q", name)
	}
	return &context{f: p.f, h: p.h}, nil
}

type context struct {
	f *Fabric
	h *host
}

func (c *context) Name() string { return DeviceName }

func (c *context) QueryPort(port int) (verbs.PortAttr, error) {
	if port != 1 {
		return verbs.PortAttr{}, fmt.Errorf("fakeverbs: %s has no port %d", DeviceName, port)
	}
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	st := verbs.PortActive
	if c.h.down || c.h.pulled {
		st = verbs.PortDown
	}
	return verbs.PortAttr{State: st, MaxMTU: 5, ActiveMTU: 5, GIDTableLen: 2, LinkLayer: 2}, nil
}

func (c *context) QueryGID(port, index int) (verbs.GID, error) {
	if port != 1 || index < 0 || index > 1 {
		return verbs.GID{}, fmt.Errorf("fakeverbs: no GID %d on port %d", index, port)
	}
	if index == 0 {
		return verbs.GID{0: 0xfe, 1: 0x80, 15: 1}, nil
	}
	return c.h.gid, nil
}

func (c *context) AllocPD() (verbs.PD, error) { return &pd{c: c}, nil }

func (c *context) CreateCQ(entries int) (verbs.CQ, error) {
	if entries < 1 || entries > 1<<16 {
		return nil, fmt.Errorf("fakeverbs: CQ of %d entries", entries)
	}
	return &cq{cap: entries, notify: make(chan struct{}, 1)}, nil
}

func (c *context) Close() error { return nil }

type pd struct{ c *context }

var pageSize = os.Getpagesize()

func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if len(buf) == 0 || uintptr(unsafe.Pointer(&buf[0]))%uintptr(pageSize) != 0 {
		return nil, errors.New("fakeverbs: reg_mr: buffer not page-aligned")
	}
	if access&verbs.AccessLocalWrite == 0 || access&(verbs.AccessRemoteWrite|verbs.AccessRemoteRead) == 0 {
		return nil, fmt.Errorf("fakeverbs: reg_mr: access %#x refused (LOCAL_WRITE with remote access required)", access)
	}
	f := p.c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.c.h.mrs >= MaxMR {
		return nil, fmt.Errorf("fakeverbs: reg_mr: %d memory regions already registered (limit %d)", p.c.h.mrs, MaxMR)
	}
	p.c.h.mrs++
	return &mr{pd: p, buf: buf}, nil
}

func (p *pd) CreateQP(a verbs.QPInit) (verbs.QP, error) {
	scq, ok1 := a.SendCQ.(*cq)
	rcq, ok2 := a.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, errors.New("fakeverbs: create_qp: completion queues of another provider")
	}
	if a.MaxRecvWR < 1 || a.MaxSendWR < 1 {
		return nil, errors.New("fakeverbs: create_qp: queue depths must be positive")
	}
	f := p.c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextQPN++
	q := &qp{f: f, h: p.c.h, num: f.nextQPN, scq: scq, rcq: rcq, maxSend: a.MaxSendWR, maxRecv: a.MaxRecvWR}
	q.cond = sync.NewCond(&q.mu)
	f.qps[q.num] = q
	return q, nil
}

func (p *pd) Close() error { return nil }

type mr struct {
	pd     *pd
	buf    []byte
	closed bool
}

func (m *mr) LKey() uint32 { return 0x1000 }
func (m *mr) RKey() uint32 { return 0x2000 }
func (m *mr) Buf() []byte  { return m.buf }
func (m *mr) Close() error {
	f := m.pd.c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !m.closed {
		m.closed = true
		m.pd.c.h.mrs--
	}
	return nil
}

// within reports whether b lies inside the region.
func (m *mr) within(b []byte) bool {
	if len(b) == 0 || len(m.buf) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&m.buf[0]))
	p := uintptr(unsafe.Pointer(&b[0]))
	return !m.closed && p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(m.buf))
}

type cq struct {
	mu     sync.Mutex
	cap    int
	wcs    []verbs.WC
	err    error
	notify chan struct{}
}

func (c *cq) push(wc verbs.WC) {
	c.mu.Lock()
	if len(c.wcs) >= c.cap {
		if c.err == nil {
			c.err = fmt.Errorf("fakeverbs: completion queue overrun (%d entries)", c.cap)
		}
	} else {
		c.wcs = append(c.wcs, wc)
	}
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *cq) Poll(out []verbs.WC) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	n := copy(out, c.wcs)
	c.wcs = c.wcs[:copy(c.wcs, c.wcs[n:])]
	return n, nil
}

func (c *cq) Notify() <-chan struct{} { return c.notify }
func (c *cq) Close() error            { return nil }

type qpState int

const (
	stReset qpState = iota
	stInit
	stRTR
	stRTS
	stClosed
)

type recvWR struct {
	id  uint64
	buf []byte
}

type message struct {
	data []byte
	due  time.Time
}

type qp struct {
	f        *Fabric
	h        *host
	num      uint32
	scq, rcq *cq
	maxSend  int
	maxRecv  int

	mu      sync.Mutex
	cond    *sync.Cond
	state   qpState
	remote  uint32
	recvs   []recvWR
	frames  int          // posted receive frames
	pending [][]byte     // NoRecvBlock: messages waiting for a RECV
	wire    chan message // delayed or tail-lossy delivery, when started
	stop    chan struct{}
	done    chan struct{}
}

func (q *qp) Num() uint32 { return q.num }

func (q *qp) Init(port int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != stReset || port != 1 {
		return fmt.Errorf("fakeverbs: qp %d: INIT from state %d on port %d", q.num, q.state, port)
	}
	q.state = stInit
	return nil
}

func (q *qp) ReadyToReceive(a verbs.RTR) error {
	q.f.mu.Lock()
	r := q.f.qps[a.DestQPN]
	q.f.mu.Unlock()
	if r == nil || r.h.gid != a.DGID {
		return fmt.Errorf("fakeverbs: qp %d: RTR: no queue pair %d at GID %s", q.num, a.DestQPN, a.DGID)
	}
	if a.SGIDIndex != 1 {
		return fmt.Errorf("fakeverbs: qp %d: RTR: GID index %d holds no routable GID (errno 22)", q.num, a.SGIDIndex)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != stInit {
		return fmt.Errorf("fakeverbs: qp %d: RTR from state %d", q.num, q.state)
	}
	q.remote = a.DestQPN
	q.state = stRTR
	return nil
}

func (q *qp) ReadyToSend(psn uint32) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state != stRTR {
		return fmt.Errorf("fakeverbs: qp %d: RTS from state %d", q.num, q.state)
	}
	q.state = stRTS
	if fl := q.f.faultsFor(q.h); fl.Delay > 0 || fl.TailLoss > 0 {
		q.wire = make(chan message, 1024)
		q.stop = make(chan struct{})
		q.done = make(chan struct{})
		go q.runWire(fl.TailLoss)
	}
	return nil
}

func (f *Fabric) faultsFor(h *host) Faults {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.faults.From != "" && f.faults.From != h.name {
		return Faults{NoRecv: f.faults.NoRecv}
	}
	return f.faults
}

func (q *qp) PostRecv(id uint64, m verbs.MR, buf []byte) error {
	mm, ok := m.(*mr)
	if !ok || !mm.within(buf) {
		return fmt.Errorf("fakeverbs: qp %d: post_recv: buffer outside the memory region", q.num)
	}
	if q.pulled() {
		return fmt.Errorf("fakeverbs: qp %d: post_recv: %w", q.num, errPulled)
	}
	q.mu.Lock()
	if q.state < stInit || q.state == stClosed {
		q.mu.Unlock()
		return fmt.Errorf("fakeverbs: qp %d: post_recv in state %d", q.num, q.state)
	}
	n := verbs.Frames(len(buf))
	if q.frames+n > q.maxRecv {
		q.mu.Unlock()
		return fmt.Errorf("fakeverbs: qp %d: post_recv: %d frames posted, %d more exceed the depth %d: %w", q.num, q.frames, n, q.maxRecv, errNoMem)
	}
	q.recvs = append(q.recvs, recvWR{id: id, buf: buf})
	q.frames += n
	var waiting [][]byte
	if len(q.pending) > 0 {
		waiting, q.pending = q.pending, nil
	}
	q.mu.Unlock()
	for _, d := range waiting {
		q.land(d)
	}
	return nil
}

var (
	errPulled = errors.New("link pulled (EIO)")
	errNoMem  = errors.New("ENOMEM")
)

func (q *qp) pulled() bool {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	return q.h.pulled
}

func (q *qp) PostSend(id uint64, m verbs.MR, buf []byte) error {
	mm, ok := m.(*mr)
	if !ok || !mm.within(buf) {
		return fmt.Errorf("fakeverbs: qp %d: post_send: buffer outside the memory region", q.num)
	}
	if verbs.Frames(len(buf)) > q.maxSend {
		return fmt.Errorf("fakeverbs: qp %d: post_send: %d frames exceed the depth %d: %w", q.num, verbs.Frames(len(buf)), q.maxSend, errNoMem)
	}
	q.mu.Lock()
	st, remote, wire := q.state, q.remote, q.wire
	q.mu.Unlock()
	if st != stRTS {
		return fmt.Errorf("fakeverbs: qp %d: post_send in state %d (not RTS)", q.num, st)
	}
	f := q.f
	f.mu.Lock()
	if q.h.pulled {
		f.mu.Unlock()
		return fmt.Errorf("fakeverbs: qp %d: post_send: %w", q.num, errPulled)
	}
	f.stats.Sent++
	msgNo := f.stats.Sent
	if h := f.hosts[f.faults.Silence]; h != nil && f.faults.SilenceAfter > 0 && msgNo > f.faults.SilenceAfter {
		h.silent = true
	}
	if h := f.hosts[f.faults.Pull]; h != nil && f.faults.PullAfter > 0 && msgNo > f.faults.PullAfter {
		h.pulled = true
	}
	if q.h.pulled {
		f.mu.Unlock()
		return fmt.Errorf("fakeverbs: qp %d: post_send: %w", q.num, errPulled)
	}
	r := f.qps[remote]
	fl := f.faults
	if fl.From != "" && fl.From != q.h.name {
		fl = Faults{NoRecv: fl.NoRecv}
	}
	lose := false
	budget := fl.MaxFaults == 0 || f.stats.Lost+f.stats.TailLost+f.stats.Flipped < fl.MaxFaults
	if budget && (fl.Bytes <= 0 || len(buf) == fl.Bytes) {
		for _, n := range fl.LoseNth {
			if n == msgNo {
				lose = true
			}
		}
		if fl.Loss > 0 && f.rng.Float64() < fl.Loss {
			lose = true
		}
	}
	silent := q.h.silent || r == nil || r.h.silent || r.h.pulled
	switch {
	case silent:
		f.stats.Silenced++
	case lose:
		f.stats.Lost++
	}
	f.mu.Unlock()
	// The local completion comes whatever happens to the message, and only
	// once its bytes are read: the sender may reuse the buffer after it.
	done := func() {
		q.scq.push(verbs.WC{ID: id, Status: verbs.StatusSuccess, Opcode: verbs.OpSend, ByteLen: uint32(len(buf)), QPNum: q.num})
	}
	if silent || lose {
		done()
		return nil
	}
	if wire != nil {
		m := message{data: append([]byte(nil), buf...), due: time.Now().Add(fl.Delay)}
		done()
		select {
		case wire <- m:
		case <-q.stop:
		}
		return nil
	}
	r.land(buf)
	done()
	return nil
}

// runWire delivers the messages of a delayed or tail-lossy queue pair in
// order: each delay after it was posted, and with tail loss, only once a later message
// follows within the gap.
func (q *qp) runWire(gap time.Duration) {
	defer close(q.done)
	var held []byte
	var tail <-chan time.Time
	var timer *time.Timer
	deliver := func(d []byte) {
		q.f.mu.Lock()
		r := q.f.qps[q.remote]
		q.f.mu.Unlock()
		if r != nil {
			r.land(d)
		}
	}
	for {
		select {
		case <-q.stop:
			if timer != nil {
				timer.Stop()
			}
			return
		case m := <-q.wire:
			d := m.data
			if wait := time.Until(m.due); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-q.stop:
					t.Stop()
					return
				}
			}
			if gap <= 0 {
				deliver(d)
				continue
			}
			if held != nil {
				deliver(held)
			}
			held = d
			if timer == nil {
				timer = time.NewTimer(gap)
			} else {
				timer.Reset(gap)
			}
			tail = timer.C
		case <-tail:
			tail = nil
			if held == nil {
				continue
			}
			q.f.mu.Lock()
			fl := q.f.faults
			drop := fl.MaxFaults == 0 || q.f.stats.Lost+q.f.stats.TailLost+q.f.stats.Flipped < fl.MaxFaults
			if drop {
				q.f.stats.TailLost++
			}
			q.f.mu.Unlock()
			if !drop {
				deliver(held)
			}
			held = nil
		}
	}
}

// land puts a message into the head posted receive.
func (q *qp) land(d []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state < stRTR || q.state == stClosed {
		return
	}
	if len(q.recvs) == 0 {
		q.f.mu.Lock()
		block := q.f.faults.NoRecv == NoRecvBlock
		if !block {
			q.f.stats.NoRecvDrops++
		}
		q.f.mu.Unlock()
		if block && len(q.pending) < 4096 {
			q.pending = append(q.pending, append([]byte(nil), d...))
		}
		return
	}
	w := q.recvs[0]
	q.recvs = q.recvs[:copy(q.recvs, q.recvs[1:])] // keeps its array: posting does not allocate
	q.frames -= verbs.Frames(len(w.buf))
	if verbs.Frames(len(d)) != verbs.Frames(len(w.buf)) || len(d) > len(w.buf) {
		q.f.mu.Lock()
		q.f.stats.LenErrors++
		q.f.mu.Unlock()
		q.rcq.push(verbs.WC{ID: w.id, Status: verbs.StatusLocLenErr, Opcode: verbs.OpRecv, QPNum: q.num})
		return
	}
	copy(w.buf, d)
	q.f.mu.Lock()
	fl := q.f.faults
	if fl.Flip > 0 && (fl.Bytes <= 0 || len(d) == fl.Bytes) && (fl.From == "" || q.f.qps[q.remote] != nil && q.f.qps[q.remote].h.name == fl.From) &&
		(fl.MaxFaults == 0 || q.f.stats.Lost+q.f.stats.TailLost+q.f.stats.Flipped < fl.MaxFaults) &&
		q.f.rng.Float64() < fl.Flip && len(d) > 0 {
		bit := q.f.rng.IntN(len(d) * 8)
		w.buf[bit/8] ^= 1 << (bit % 8)
		q.f.stats.Flipped++
	}
	q.f.stats.Delivered++
	q.f.mu.Unlock()
	q.rcq.push(verbs.WC{ID: w.id, Status: verbs.StatusSuccess, Opcode: verbs.OpRecv, ByteLen: uint32(len(d)), QPNum: q.num})
}

func (q *qp) Close() error {
	q.mu.Lock()
	if q.state == stClosed {
		q.mu.Unlock()
		return nil
	}
	q.state = stClosed
	stop, done := q.stop, q.done
	q.recvs, q.pending = nil, nil
	q.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	q.f.mu.Lock()
	delete(q.f.qps, q.num)
	q.f.mu.Unlock()
	return nil
}
