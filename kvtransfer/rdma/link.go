package rdma

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// Errors a link fails with.
var (
	// ErrPeerUnreachable: a slot stayed unacknowledged through every
	// retransmission.
	ErrPeerUnreachable = errors.New("rdma: peer unreachable: no acknowledgement after every retransmission")
	// ErrPeerDead: the bootstrap socket, the link's liveness anchor, went
	// silent or closed.
	ErrPeerDead = errors.New("rdma: peer dead")
	// ErrClosed: the link or stream was closed locally.
	ErrClosed = errors.New("rdma: closed")
	// ErrPeerClosed: the peer closed the stream.
	ErrPeerClosed = errors.New("rdma: stream closed by the peer")
)

// Work request ids: the kind in the top byte, the slot index below.
const (
	idRecv    = 1 << 56 // a data slot's receive (data pair)
	idData    = 2 << 56 // a data slot's send (data pair)
	idCtl     = 3 << 56 // an ack-only slot's send (companion pair)
	idCtlRecv = 4 << 56 // an ack-only slot's receive (companion pair)
	idMask    = 1<<56 - 1
)

// ctlSlot is the size of an ack-only slot: one 4 KiB frame, the least a
// SEND can fill, so that an ack costs a page on the wire, not a data slot.
const ctlSlot = verbs.Frame

// LinkStats count a link's reliability work.
type LinkStats struct {
	SlotsSent, SlotsReceived int64
	Retransmits              int64 // slots sent again
	Timeouts                 int64 // retransmission timer expiries
	FastRetransmits          int64 // go-backs on a NAK
	Corrupt                  int64 // slots dropped: bad magic, epoch, length or checksum
	OutOfOrder, Duplicates   int64 // slots dropped for their sequence number
	LenErrors                int64 // receive completions with a length error
	AcksSent                 int64 // control slots sent
	Packed                   int64 // frames that joined a slot already holding another
	PackedRetransmits        int64 // slots holding more than one frame sent again
	Direct                   int64 // slots the poller placed straight into a waiting reader's destination
}

func (s *LinkStats) add(o LinkStats) {
	s.SlotsSent += o.SlotsSent
	s.SlotsReceived += o.SlotsReceived
	s.Retransmits += o.Retransmits
	s.Timeouts += o.Timeouts
	s.FastRetransmits += o.FastRetransmits
	s.Corrupt += o.Corrupt
	s.OutOfOrder += o.OutOfOrder
	s.Duplicates += o.Duplicates
	s.LenErrors += o.LenErrors
	s.AcksSent += o.AcksSent
	s.Packed += o.Packed
	s.PackedRetransmits += o.PackedRetransmits
	s.Direct += o.Direct
}

// link is one UC queue pair to one peer, made reliable with credit-based
// go-back-N, carrying the frames of many streams, and a companion queue
// pair of 4 KiB slots that carries only acks, credit and probes.
type link struct {
	cfg    *Config
	name   string   // for errors: the peer's bootstrap address
	qp     verbs.QP // data pair: sequenced slots of slot bytes
	cqp    verbs.QP // companion pair: ack-only slots of ctlSlot bytes
	cq     verbs.CQ // both pairs' completions
	mr     verbs.MR
	arena  []byte
	anchor net.Conn
	onDown func(*link) // removes the link from its owner's table

	slot, capacity int // slot bytes, payload bytes per slot
	epoch, peer    uint32
	ctl            int // ack-only slots on each side of the companion pair
	win            int // data slots: the most sequenced slots unacked or unconsumed

	sendData, sendCtl, recv, recvCtl [][]byte

	// direct holds the continuation slots arrive gave waiting readers
	// (stream.deliver), for the poller to copy once mu is released;
	// touched only by the poller, under mu while it fills it.
	direct []direct

	mu sync.Mutex
	// Sends are collected under mu and posted by unlock, outside it.
	posts   []post     // guarded by mu
	postMu  sync.Mutex // taken under mu, held while posting: posts keep their order
	posting []post     // guarded by postMu: the batch being posted
	// send side
	nextSeq    uint64 // next sequence number to assign (from 1)
	postNext   uint64 // next sequence number to post (go-back-N moves it back)
	maxPosted  uint64 // one past the highest sequence number ever posted
	acked      uint64 // the peer's cumulative ack
	peerCredit uint64 // the highest seq the peer can take
	ready      []bool // per data slot: filled and sealed
	inflight   []bool // per data slot: posted, send completion not yet polled
	packed     []bool // per data slot: holds more than one frame
	ctlBusy    []bool
	ctlNext    int
	goBack     uint64 // base of the last go-back on a NAK
	probeSeq   uint64 // maxPosted when the timer sent a probe (0: none pending)
	probeNum   uint16 // the number of the last probe sent
	probeAsked bool   // the peer probed us: answer with flagProbeReply
	probeFor   uint16 // the number of the probe to answer
	rto        time.Duration
	rtt        rttEstimator // round trips of slots sent once
	sentAt     []time.Time  // per data slot: when it was first posted
	resent     []bool       // per data slot: posted more than once (no RTT sample)
	tries      int
	rtxAt      time.Time // when the retransmission timer expires (zero: off)
	rtxTimer   *time.Timer
	credWait   bool // a filled slot waits for credit
	// receive side
	expected              uint64 // next in-order seq
	consumed              uint64 // in-order sequenced slots released
	ackSent, creditSent   uint64 // what the peer last heard
	nakFor                uint64 // the expected seq a NAK was sent for
	ackTimer              *time.Timer
	ackArmed, ackNow      bool
	streams               map[uint32]*stream
	nextStream            uint32
	accept                chan *stream // listener side: streams the peer opened
	changed               chan struct{}
	freed                 bool // handle: a writer waiting on changed may go on
	err                   error
	done                  chan struct{}
	users                 sync.WaitGroup // goroutines touching the arena outside mu
	stats                 LinkStats
	pollerDone, anchorOut chan struct{}
	anchorLocal           string
}

func (l *link) credit() uint64 { return l.consumed + uint64(l.win) }

// post is a SEND collected under mu.
type post struct {
	qp  verbs.QP
	id  uint64
	buf []byte
	ctl bool // an ack-only slot (for the error)
}

// unlock releases mu and then posts the sends collected under it, in
// order. Every path that releases mu goes through here. A SEND copies
// its slot (the fake wire's memcpy, a device's DMA read) and, on the fake
// wire, lands it in the peer's slot: outside mu, the poller, readers and
// writers of the link do not wait for that copy. postMu, taken before mu
// is released, keeps the posts of all goroutines in the order they were
// collected, and the poster counts as a user of the arena, so teardown
// waits for it. A slot collected stays untouched until its send
// completion (inflight, ctlBusy), which comes once its bytes are read.
func (l *link) unlock() {
	if len(l.posts) == 0 || l.err != nil {
		l.posts = l.posts[:0]
		l.mu.Unlock()
		return
	}
	l.postMu.Lock()
	l.posting, l.posts = l.posts, l.posting[:0]
	l.users.Add(1)
	l.mu.Unlock()
	var err error
	for _, p := range l.posting {
		if err = p.qp.PostSend(p.id, l.mr, p.buf); err != nil {
			what := "post send"
			if p.ctl {
				what = "post ack-only slot"
			}
			err = fmt.Errorf("rdma: link to %s: %s: %w", l.name, what, err)
			break
		}
	}
	clear(l.posting)
	l.posting = l.posting[:0]
	l.postMu.Unlock()
	l.users.Done()
	if err != nil {
		l.fail(err)
	}
}

// broadcast wakes every waiter; call with mu held.
func (l *link) broadcast() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// fail breaks the link once; every stream fails with err.
func (l *link) fail(err error) {
	l.mu.Lock()
	defer l.unlock()
	l.failLocked(err)
}

func (l *link) failLocked(err error) {
	if l.err != nil {
		return
	}
	l.err = err
	close(l.done)
	l.broadcast()
	for _, s := range l.streams {
		s.wake()
	}
	if l.rtxTimer != nil {
		l.rtxTimer.Stop()
	}
	if l.ackTimer != nil {
		l.ackTimer.Stop()
	}
	if l.anchor != nil {
		// Unblocks the anchor's reader; the peer sees the socket close.
		l.anchor.Close()
	}
}

// teardown waits for the link's goroutines and users, then destroys the
// queue pair first, as Apple's stack needs, and frees the rest.
func (l *link) teardown() {
	<-l.pollerDone
	<-l.anchorOut
	l.users.Wait()
	l.qp.Close()
	l.cqp.Close()
	l.cq.Close()
	l.mr.Close()
	unmapArena(l.arena)
	if l.onDown != nil {
		l.onDown(l)
	}
}

// poll reaps completions until the link fails.
func (l *link) poll() {
	defer close(l.pollerDone)
	wcs := make([]verbs.WC, 64)
	var notify <-chan struct{}
	if n, ok := l.cq.(verbs.Notifier); ok {
		notify = n.Notify()
	}
	idle := 0
	for {
		n, err := l.cq.Poll(wcs)
		if err != nil {
			l.fail(fmt.Errorf("rdma: link to %s: poll: %w", l.name, err))
			return
		}
		if n > 0 {
			idle = 0
			l.handle(wcs[:n])
			l.placeDirect()
			continue
		}
		select {
		case <-l.done:
			return
		default:
		}
		if notify != nil {
			select {
			case <-notify:
			case <-l.done:
				return
			}
			continue
		}
		// No completion channel: spin briefly after activity, then back off.
		idle++
		if idle < 200 {
			runtime.Gosched()
			continue
		}
		d := time.Duration(min(idle-199, 50)) * 20 * time.Microsecond
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return
		}
	}
}

type arrival struct {
	idx int
	ctl bool // on the companion pair
	h   slotHeader
	ok  bool
}

// received returns the receive buffer of a receive request id, whether it
// is the companion pair's, and the bytes a SEND into it must carry; nil
// for an id the link never posted.
func (l *link) received(id uint64) (b []byte, ctl bool, size int) {
	idx := int(id & idMask)
	switch id &^ idMask {
	case idRecv:
		if idx < len(l.recv) {
			return l.recv[idx], false, l.slot
		}
	case idCtlRecv:
		if idx < len(l.recvCtl) {
			return l.recvCtl[idx], true, ctlSlot
		}
	}
	return nil, false, 0
}

// handle processes a batch of completions. Received slots are checked
// outside the lock (the poller owns them until they are reposted). An
// ack-only slot counts only on the companion pair and any other kind only
// on the data pair: a slot on the wrong pair is damaged.
func (l *link) handle(wcs []verbs.WC) {
	var arr [64]arrival
	got := arr[:0]
	for _, wc := range wcs {
		k := wc.ID &^ idMask
		if k != idRecv && k != idCtlRecv || wc.Status != verbs.StatusSuccess {
			continue
		}
		b, ctl, size := l.received(wc.ID)
		a := arrival{idx: int(wc.ID & idMask), ctl: ctl}
		if b != nil && int(wc.ByteLen) == size {
			a.h, a.ok = parse(b, size-hdrSize)
			a.ok = a.ok && a.h.epoch == l.peer && (a.h.kind == kindCtl) == ctl
		}
		got = append(got, a)
	}
	l.mu.Lock()
	defer l.unlock()
	if l.err != nil {
		return
	}
	ai := 0
	for _, wc := range wcs {
		idx := int(wc.ID & idMask)
		switch wc.ID &^ idMask {
		case idData:
			if idx < len(l.inflight) {
				l.inflight[idx] = false
				// Reusable once acked too (ready cleared): the ack
				// may have come first.
				l.freed = l.freed || !l.ready[idx]
			}
		case idCtl:
			if idx < len(l.ctlBusy) {
				l.ctlBusy[idx] = false
			}
		case idRecv, idCtlRecv:
			b, ctl, _ := l.received(wc.ID)
			if b == nil {
				l.failLocked(fmt.Errorf("rdma: link to %s: completion of request %#x, never posted", l.name, wc.ID))
				return
			}
			if wc.Status == verbs.StatusSuccess {
				l.arrive(got[ai])
				ai++
				break
			}
			if wc.Status == verbs.StatusLocLenErr {
				// A SEND that did not fill our slot's frames: a lost
				// slot, not a broken link.
				l.stats.LenErrors++
				l.repostArrival(arrival{idx: idx, ctl: ctl})
				l.nak()
				continue
			}
		}
		if wc.Status != verbs.StatusSuccess && l.err == nil {
			l.failLocked(fmt.Errorf("rdma: link to %s: completion of request %#x: %s", l.name, wc.ID, wc.Status))
		}
		if l.err != nil {
			return
		}
	}
	l.pump()
	l.maybeAck()
	// Writers (reserve, open, close) wait for a slot to come free or for
	// their stream to close; waking them for every batch of completions
	// woke each writer once per slot the link received.
	if l.freed {
		l.freed = false
		l.broadcast()
	}
}

// repost gives a data receive slot back to the data pair; with mu held.
func (l *link) repost(idx int) {
	if l.err != nil {
		return
	}
	if err := l.qp.PostRecv(idRecv|uint64(idx), l.mr, l.recv[idx]); err != nil {
		l.failLocked(fmt.Errorf("rdma: link to %s: repost receive: %w", l.name, err))
	}
}

// repostArrival gives an arrival's receive slot back to its pair; with mu
// held.
func (l *link) repostArrival(a arrival) {
	if !a.ctl {
		l.repost(a.idx)
		return
	}
	if l.err != nil {
		return
	}
	if err := l.cqp.PostRecv(idCtlRecv|uint64(a.idx), l.mr, l.recvCtl[a.idx]); err != nil {
		l.failLocked(fmt.Errorf("rdma: link to %s: repost ack receive: %w", l.name, err))
	}
}

// nak asks the peer to resend from our expected seq, once per gap.
func (l *link) nak() {
	if l.nakFor != l.expected {
		l.nakFor = l.expected
		l.sendControl(flagNak)
	}
}

// arrive handles one received slot; with mu held.
func (l *link) arrive(a arrival) {
	l.stats.SlotsReceived++
	if !a.ok {
		l.stats.Corrupt++
		l.repostArrival(a)
		l.nak()
		return
	}
	h := a.h
	// The piggybacked ack and credit, from any intact slot.
	if h.ack >= l.nextSeq {
		l.failLocked(fmt.Errorf("rdma: link to %s: peer acknowledges seq %d, never sent (next %d)", l.name, h.ack, l.nextSeq))
		return
	}
	if h.ack > l.acked {
		for q := l.acked + 1; q <= h.ack; q++ {
			l.ready[int(q%uint64(l.win))] = false
		}
		if i := int(h.ack % uint64(l.win)); !l.resent[i] {
			// Karn: only slots sent once give a round-trip sample.
			l.rtt.sample(time.Since(l.sentAt[i]))
		}
		l.acked = h.ack
		l.freed = true
		l.tries = 0
		l.rto = l.baseRTO()
		if l.postNext <= l.acked {
			l.postNext = l.acked + 1
		}
		l.armRetransmit(true)
	}
	if h.credit > l.peerCredit {
		l.peerCredit = h.credit
	}
	if l.credWait && l.acked+1 >= l.maxPosted {
		// Only waiting for credit, and the peer is alive: not a failure.
		l.tries = 0
		l.rto = l.baseRTO()
	}
	if h.flags&flagNak != 0 && h.ack+1 < l.nextSeq && l.goBack != h.ack+1 {
		l.goBack = h.ack + 1
		l.postNext = h.ack + 1
		l.stats.FastRetransmits++
	}
	if h.flags&flagProbe != 0 {
		l.probeAsked, l.probeFor = true, h.probe
	}
	if settled, resend := probeAnswer(h, l.acked, l.probeSeq, l.probeNum); settled {
		if resend {
			l.postNext = h.ack + 1
			l.goBack = h.ack + 1
		}
		l.probeSeq = 0
	}
	if h.kind == kindCtl {
		l.repostArrival(a)
		return
	}
	switch {
	case h.seq < l.expected:
		// Our ack was lost or late: say again what we have.
		l.stats.Duplicates++
		l.repost(a.idx)
		l.ackNow = true
		return
	case h.seq > l.expected:
		l.stats.OutOfOrder++
		l.repost(a.idx)
		l.nak()
		return
	}
	if h.seq > l.credit() {
		l.failLocked(fmt.Errorf("rdma: link to %s: peer sent seq %d beyond our credit %d", l.name, h.seq, l.credit()))
		return
	}
	l.expected++
	l.armAck()
	switch h.kind {
	case kindOpen:
		l.repost(a.idx)
		l.consumed++
		if l.accept == nil || l.streams[h.stream] != nil {
			l.failLocked(fmt.Errorf("rdma: link to %s: unexpected open of stream %d", l.name, h.stream))
			return
		}
		s := newStream(l, h.stream)
		select {
		case l.accept <- s:
			l.streams[h.stream] = s
		default:
			// Nobody accepts fast enough: refuse the stream.
			l.sendSequenced(kindClose, h.stream)
		}
	case kindClose:
		l.repost(a.idx)
		l.consumed++
		if s := l.streams[h.stream]; s != nil {
			s.peerClosed = true
			s.wake()
			l.freed = true // its writer fails now
		}
	case kindData:
		s := l.streams[h.stream]
		if s == nil || s.closed {
			l.repost(a.idx)
			l.consumed++
			return
		}
		if s.deliver(a.idx, h) {
			return
		}
		s.queue = append(s.queue, rslot{idx: a.idx, h: h})
		s.wake()
	}
}

// direct is a continuation slot for a waiting reader: n payload bytes of
// receive slot idx go to dst (nil: the reader skips the payload).
type direct struct {
	s   *stream
	idx int
	n   int
	dst []byte
}

// placeDirect copies the slots handle gave waiting readers into their
// destinations, outside mu (the reader does not touch dst while copies
// are under way, and the slots stay unposted until released here), then
// releases the slots, which returns their credit, and wakes each reader
// whose frame is whole or who stopped waiting. Teardown waits for the
// poller, so the arena outlives the copies.
func (l *link) placeDirect() {
	if len(l.direct) == 0 {
		return
	}
	for _, d := range l.direct {
		if d.dst != nil {
			copy(d.dst, l.recv[d.idx][hdrSize:hdrSize+d.n])
		}
	}
	l.mu.Lock()
	defer l.unlock()
	for _, d := range l.direct {
		l.releaseLocked(d.idx)
		c := &d.s.cont
		if c.copying--; c.copying == 0 && (!c.on || c.got == c.pl) {
			d.s.wake()
		}
	}
	clear(l.direct)
	l.direct = l.direct[:0]
}

// probeAnswer reads h as the answer to the probe pending, number num,
// sent when maxPosted was probeSeq (0: none pending); acked already
// counts h's ack. Only that probe's answer settles it: an answer to an
// older probe, which came after the timer sent the next one, says nothing
// about the slots sent since, and taking it for the pending one resent
// slots that were only late. The answer's ack covers every slot sent
// before the probe that arrived (the wire keeps order), so with an ack
// that did not move and is short of probeSeq, the slots from ack+1 are
// lost: resend them.
func probeAnswer(h slotHeader, acked, probeSeq uint64, num uint16) (settled, resend bool) {
	if h.flags&flagProbeReply == 0 || probeSeq == 0 || h.probe != num {
		return false, false
	}
	return true, h.ack == acked && h.ack+1 < probeSeq
}

// release hands a consumed data slot back; called by readers.
func (l *link) release(idx int) {
	l.mu.Lock()
	defer l.unlock()
	l.releaseLocked(idx)
}

func (l *link) releaseLocked(idx int) {
	l.repost(idx)
	l.consumed++
	l.armAck()
	l.maybeAck()
}

// armAck notes that the peer should hear our new ack or credit.
func (l *link) armAck() {
	if l.ackArmed || l.err != nil {
		return
	}
	l.ackArmed = true
	if l.ackTimer == nil {
		l.ackTimer = time.AfterFunc(l.cfg.AckDelay, l.onAckTimer)
	} else {
		l.ackTimer.Reset(l.cfg.AckDelay)
	}
}

func (l *link) onAckTimer() {
	l.mu.Lock()
	defer l.unlock()
	l.ackArmed = false
	if l.err != nil {
		return
	}
	if l.expected-1 != l.ackSent || l.credit() != l.creditSent {
		l.sendControl(0)
	}
}

// maybeAck sends an ack now when enough has accumulated or one is asked
// for; otherwise the ack timer or the next data slot carries it.
func (l *link) maybeAck() {
	if l.probeAsked {
		l.probeAsked, l.ackNow = false, false
		l.sendControl(flagProbeReply)
		return
	}
	every := uint64(max(l.win/2, 1))
	if l.ackNow || l.expected-1 >= l.ackSent+every || l.credit() >= l.creditSent+every {
		l.ackNow = false
		l.sendControl(0)
	}
}

// sendControl sends an ack-only slot carrying our ack and credit on the
// companion pair; with mu held. With every ack-only slot still in flight
// it gives up: the ack timer or the peer's retransmission brings another
// chance.
func (l *link) sendControl(flags uint8) {
	if l.err != nil {
		return
	}
	i := -1
	for k := 0; k < len(l.sendCtl); k++ {
		j := (l.ctlNext + k) % len(l.sendCtl)
		if !l.ctlBusy[j] {
			i = j
			break
		}
	}
	if i < 0 {
		l.armAck()
		return
	}
	l.ctlNext = i + 1
	h := slotHeader{epoch: l.epoch, ack: l.expected - 1, credit: l.credit(), kind: kindCtl, flags: flags}
	switch {
	case flags&flagProbe != 0:
		h.probe = l.probeNum
	case flags&flagProbeReply != 0:
		h.probe = l.probeFor
	}
	h.put(l.sendCtl[i])
	l.posts = append(l.posts, post{qp: l.cqp, id: idCtl | uint64(i), buf: l.sendCtl[i], ctl: true})
	l.ctlBusy[i] = true
	l.ackSent, l.creditSent = h.ack, h.credit
	l.stats.AcksSent++
}

// pump posts filled data slots in sequence order from postNext; with mu
// held.
func (l *link) pump() {
	defer func() {
		// A filled slot beyond the peer's credit keeps the timer running:
		// a lost credit update is asked for by a probe.
		wait := l.err == nil && l.postNext < l.nextSeq && l.postNext > l.peerCredit && l.ready[int(l.postNext%uint64(l.win))]
		if wait != l.credWait {
			l.credWait = wait
			l.armRetransmit(false)
		}
	}()
	for l.err == nil && l.postNext < l.nextSeq {
		i := int(l.postNext % uint64(l.win))
		if !l.ready[i] || l.inflight[i] || l.postNext > l.peerCredit {
			break
		}
		b := l.sendData[i]
		ack, credit := l.expected-1, l.credit()
		refresh(b, ack, credit)
		l.posts = append(l.posts, post{qp: l.qp, id: idData | uint64(i), buf: b})
		l.inflight[i] = true
		l.ackSent, l.creditSent = ack, credit
		l.stats.SlotsSent++
		if l.postNext < l.maxPosted {
			l.stats.Retransmits++
			if l.packed[i] {
				l.stats.PackedRetransmits++
			}
			l.resent[i] = true
		} else {
			l.maxPosted = l.postNext + 1
			l.sentAt[i], l.resent[i] = time.Now(), false
		}
		l.postNext++
		l.armRetransmit(false)
	}
}

// baseRTO is the retransmission timeout after progress: the estimator's,
// between the configured RTO and MaxRTO.
func (l *link) baseRTO() time.Duration { return l.rtt.rto(l.cfg.RTO, l.cfg.MaxRTO) }

// rttEstimator smooths round-trip samples as TCP does (RFC 6298): the mean
// and the mean deviation, so that a wire whose round trips vary (a delayed
// wire, a loaded machine) gets a timeout above its spread and does not
// look lossy, while a steady one keeps the floor.
type rttEstimator struct {
	srtt, rttvar time.Duration
}

func (e *rttEstimator) sample(d time.Duration) {
	if e.srtt == 0 {
		e.srtt, e.rttvar = d, d/2
		return
	}
	dev := e.srtt - d
	if dev < 0 {
		dev = -dev
	}
	e.rttvar += (dev - e.rttvar) / 4
	e.srtt += (d - e.srtt) / 8
}

// rto is srtt + 4 rttvar, at least floor and at most ceil.
func (e *rttEstimator) rto(floor, ceil time.Duration) time.Duration {
	return min(max(floor, e.srtt+4*e.rttvar), ceil)
}

// armRetransmit keeps the retransmission timer running while anything is
// unacknowledged or a writer waits for credit; restart pushes its expiry
// out by one RTO (after progress).
func (l *link) armRetransmit(restart bool) {
	if l.err != nil {
		return
	}
	outstanding := l.acked+1 < l.maxPosted || l.credWait
	if !outstanding {
		l.rtxAt = time.Time{}
		return
	}
	if !l.rtxAt.IsZero() && !restart {
		return
	}
	l.rtxAt = time.Now().Add(l.rto)
	if l.rtxTimer == nil {
		l.rtxTimer = time.AfterFunc(l.rto, l.onRetransmit)
	} else {
		l.rtxTimer.Reset(l.rto)
	}
}

func (l *link) onRetransmit() {
	l.mu.Lock()
	defer l.unlock()
	if l.err != nil || l.rtxAt.IsZero() {
		return
	}
	if now := time.Now(); now.Before(l.rtxAt) {
		l.rtxTimer.Reset(l.rtxAt.Sub(now))
		return
	}
	l.rtxAt = time.Time{}
	if !(l.acked+1 < l.maxPosted || l.credWait) {
		return
	}
	l.tries++
	if l.tries > l.cfg.Retries {
		l.failLocked(fmt.Errorf("rdma: link to %s: %w (%d tries, seq %d)", l.name, ErrPeerUnreachable, l.tries-1, l.acked+1))
		return
	}
	l.stats.Timeouts++
	l.rto = min(2*l.rto, l.cfg.MaxRTO)
	// Ask before resending: the reply says what was lost (arrive), and a
	// slot whose ack is only late (a loaded receiver) is not sent again;
	// with only credit missing, the reply carries it.
	l.probeSeq = l.maxPosted
	if l.probeNum++; l.probeNum == 0 {
		l.probeNum = 1
	}
	l.sendControl(flagProbe)
	l.armRetransmit(true)
}

// reserve waits for a data slot for s's writer and returns it with its
// header so far. A frame (start) joins the stream's last slot when that
// slot is filled but not yet posted (it waits for the peer's credit or
// for an earlier slot) and has room for the whole frame, or for its
// prefix and header when the frame needs more than a slot anyway: packing
// never holds back a slot that could go now. Otherwise, and for a frame's
// later fragments, it takes the next slot, free once the slot a window
// earlier is acknowledged. The pump, not the writer, waits for credit, so
// a writer fills the slots the peer acknowledged but has not yet read
// (the ack runs ahead of the credit): those wait, and later frames join
// them. The caller fills the slot outside the lock and calls commit.
func (l *link) reserve(deadline *deadline, s *stream, start bool, frame, head int) (seq uint64, h slotHeader, buf []byte, err error) {
	l.mu.Lock()
	defer l.unlock()
	for {
		if l.err != nil {
			return 0, h, nil, l.err
		}
		if err := s.writeErr(); err != nil {
			return 0, h, nil, err
		}
		if t := s.tail; start && t != 0 {
			i := int(t % uint64(l.win))
			room := l.capacity - int(s.tailHdr.n)
			if t >= l.maxPosted && t > l.acked && t < l.nextSeq && l.ready[i] && !l.inflight[i] &&
				(frame <= room || (frame > l.capacity && head <= room)) {
				l.ready[i] = false
				l.stats.Packed++
				l.users.Add(1)
				return t, s.tailHdr, l.sendData[i], nil
			}
		}
		seq = l.nextSeq
		i := int(seq % uint64(l.win))
		if seq <= l.acked+uint64(l.win) && !l.inflight[i] && !l.ready[i] {
			l.nextSeq++
			l.packed[i] = false
			l.users.Add(1)
			return seq, slotHeader{stream: s.id, kind: kindData}, l.sendData[i], nil
		}
		ch := l.changed
		l.unlock()
		select {
		case <-ch:
		case <-deadline.wait():
			l.mu.Lock()
			return 0, h, nil, errTimeout
		}
		l.mu.Lock()
	}
}

// commit seals a slot reserve gave s's writer (h.pcrc already covers its
// payload), makes it the stream's last slot if it has room left, and
// posts what is ready in order.
func (l *link) commit(seq uint64, h slotHeader, buf []byte, s *stream) {
	h.epoch, h.seq = l.epoch, seq
	h.put(buf)
	l.mu.Lock()
	defer l.unlock()
	l.users.Done()
	if l.err != nil {
		return
	}
	i := int(seq % uint64(l.win))
	l.ready[i] = true
	l.packed[i] = h.nfrag > 1 || (h.nfrag == 1 && h.frag > 0)
	s.tail, s.tailHdr = 0, slotHeader{}
	if int(h.n) < l.capacity {
		s.tail, s.tailHdr = seq, h
	}
	l.pump()
}

// sendSequenced queues an empty OPEN or CLOSE slot if one is free now;
// with mu held. It reports whether it could.
func (l *link) sendSequenced(k kind, stream uint32) bool {
	seq := l.nextSeq
	i := int(seq % uint64(l.win))
	if l.err != nil || seq > l.acked+uint64(l.win) || l.inflight[i] || l.ready[i] {
		return false
	}
	l.nextSeq++
	l.packed[i] = false
	h := slotHeader{epoch: l.epoch, seq: seq, stream: stream, kind: k}
	h.put(l.sendData[i])
	l.ready[i] = true
	l.pump()
	return true
}
