package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/kvtransfer/faultproxy"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var loopGID = verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))

// pair is two hosts on a fake fabric, a listener on one and a transport
// that dials it from the other.
type pair struct {
	fab      *fakeverbs.Fabric
	dialer   *rdma.Transport
	server   *rdma.Transport
	listener *rdma.Listener
}

func newPair(t *testing.T, f fakeverbs.Faults, cfg rdma.Config) *pair {
	t.Helper()
	fab := fakeverbs.NewFabric(f, 1)
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	cd, cs := cfg, cfg
	cd.Provider = fab.Host("a", loopGID)
	cs.Provider = fab.Host("b", loopGID)
	d, err := rdma.New(cd)
	if err != nil {
		t.Fatal(err)
	}
	s, err := rdma.New(cs)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		ln.Close()
		s.Close()
	})
	return &pair{fab: fab, dialer: d, server: s, listener: ln}
}

func (p *pair) conns(t *testing.T) (*rdma.Conn, *rdma.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.dialer.Dial(ctx, p.listener.Addr())
	if err != nil {
		t.Fatal(err)
	}
	acc := make(chan *rdma.Conn, 1)
	go func() {
		s, _ := p.listener.Accept()
		acc <- s
	}()
	var s *rdma.Conn
	select {
	case s = <-acc:
	case <-ctx.Done():
	}
	if s == nil {
		c.Close()
		t.Fatal("no stream accepted")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func readAll(c *rdma.Conn) (hdr string, payload []byte, err error) {
	err = c.ReadFrame(func(h []byte, n int) ([]byte, error) {
		hdr = string(h)
		payload = make([]byte, n)
		return payload, nil
	})
	return
}

func randBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	return b
}

// sendRecv sends frames of the given sizes one way and checks each arrives
// intact and in order.
func sendRecv(t *testing.T, c, s *rdma.Conn, sizes []int) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		for i, n := range sizes {
			if err := c.WriteFrame([]byte(fmt.Sprintf("h%d", i)), randBytes(n, uint64(i))); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i, n := range sizes {
		h, p, err := readAll(s)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if h != fmt.Sprintf("h%d", i) || !bytes.Equal(p, randBytes(n, uint64(i))) {
			t.Fatalf("frame %d of %d bytes: header %q, payload intact %v", i, n, h, bytes.Equal(p, randBytes(n, uint64(i))))
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

var sizes = []int{0, 1, 100, 128<<10 - 80, 128 << 10, 1 << 20, 3<<20 + 17, 5000, 0}

func TestFramesCleanWire(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{})
	c, s := p.conns(t)
	sendRecv(t, c, s, sizes)
	sendRecv(t, s, c, sizes)
	// Retransmissions may happen on a loaded machine (a late ack looks like
	// a loss); damage may not.
	st := p.dialer.Stats()
	if st.Corrupt != 0 || st.LenErrors != 0 {
		t.Errorf("clean wire: %+v", st)
	}
	t.Logf("wire %+v, dialer %+v", p.fab.Stats(), st)
}

func TestFramesUnderFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    fakeverbs.Faults
	}{
		{"loss1pct", fakeverbs.Faults{Loss: 0.01}},
		{"loss10pct", fakeverbs.Faults{Loss: 0.10}},
		{"nth", fakeverbs.Faults{LoseNth: []int64{1, 2, 5, 9, 30, 31, 32, 60}}},
		{"tail", fakeverbs.Faults{TailLoss: 2 * time.Millisecond, MaxFaults: 6}},
		{"delay", fakeverbs.Faults{Delay: 3 * time.Millisecond}},
		{"flips", fakeverbs.Faults{Flip: 0.05}},
		{"block", fakeverbs.Faults{Loss: 0.02, NoRecv: fakeverbs.NoRecvBlock}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, tc.f, rdma.Config{SlotSize: 32 << 10, Slots: 8, Reserve: 2})
			c, s := p.conns(t)
			sendRecv(t, c, s, sizes)
			sendRecv(t, s, c, sizes)
			t.Logf("wire %+v, dialer %+v", p.fab.Stats(), p.dialer.Stats())
		})
	}
}

// Many streams share one link; each stays in order.
func TestStreamsMultiplexed(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{Loss: 0.02}, rdma.Config{SlotSize: 16 << 10, Slots: 8, Reserve: 2})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		c, s := p.conns(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sendRecv(t, c, s, []int{10, 40000, 1, 70000})
		}()
	}
	wg.Wait()
}

func TestReadDeadlineAndClose(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{})
	c, s := p.conns(t)
	s.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, _, err := readAll(s)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v", err)
	}
	s.SetReadDeadline(time.Time{})
	if err := c.WriteFrame([]byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, _, err := readAll(s); err != nil {
		t.Fatalf("frame before close: %v", err)
	}
	if _, _, err := readAll(s); err != io.EOF {
		t.Fatalf("after the peer closed: %v, want EOF", err)
	}
}

// A peer that goes silent (its data path and its anchor) is detected
// within a second: the anchor runs through a proxy that stops forwarding
// while both sockets stay open, as when the peer process hangs; nothing is
// closed, so only the missing heartbeats can tell.
func TestDeadPeerDetected(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{})
	px, err := faultproxy.Start(faultproxy.Config{Target: p.listener.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.dialer.Dial(ctx, px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := p.listener.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sendRecv(t, c, s, []int{10})
	p.fab.Silence("b")
	px.SetFaults(faultproxy.Faults{Silent: true})
	start := time.Now()
	_, _, err = readAll(c)
	d := time.Since(start)
	if !errors.Is(err, rdma.ErrPeerDead) || !strings.Contains(err.Error(), "no heartbeat") {
		t.Fatalf("read from a silent peer: %v, want ErrPeerDead for missing heartbeats", err)
	}
	if d > time.Second {
		t.Errorf("silent peer detected after %v", d)
	}
	if st := px.Stats(); st.Cuts != 0 {
		t.Fatalf("the proxy closed a connection (%+v): the test must keep the anchor open", st)
	}
	t.Logf("detected in %v: %v", d.Round(time.Millisecond), err)
}

// A silent data path with a live anchor fails after bounded retransmits.
func TestSilentDataPathFails(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{RTO: time.Millisecond, MaxRTO: 5 * time.Millisecond, Retries: 5})
	c, _ := p.conns(t)
	p.fab.Silence("b")
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		err = c.WriteFrame([]byte("h"), make([]byte, 100<<10))
	}
	if err == nil {
		_, _, err = readAll(c)
	}
	if !errors.Is(err, rdma.ErrPeerUnreachable) {
		t.Fatalf("silent data path: %v", err)
	}
}

// A pulled link fails posts; the link breaks with an error, not a hang.
func TestPulledLink(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{})
	c, _ := p.conns(t)
	p.fab.Pull("a")
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		err = c.WriteFrame([]byte("h"), make([]byte, 100<<10))
	}
	if err == nil {
		t.Fatal("writes over a pulled link succeeded")
	}
}

// One link per peer: many dials share it, and a new one replaces a dead one.
func TestOneLinkPerPeer(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{})
	for i := 0; i < 5; i++ {
		c, s := p.conns(t)
		sendRecv(t, c, s, []int{1000})
	}
	if st := p.fab.Stats(); st.Sent > 100 {
		t.Logf("%+v", st)
	}
}

// TestBootstrapBounded: the listener allocates nothing for a connection
// that is not a link bootstrap, and holds at most MaxLinks links; a dialer
// beyond them is refused, the others keep working.
func TestBootstrapBounded(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{MaxLinks: 1})
	junk, err := net.Dial("tcp", p.listener.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	if _, err := junk.Write(bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 4)); err != nil {
		t.Fatal(err)
	}
	junk.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := junk.Read(make([]byte, 64)); err == nil {
		t.Fatalf("a non-bootstrap got %d bytes back", n)
	}
	if n := p.fab.MRs("b"); n != 0 {
		t.Fatalf("the listener registered %d memory regions for junk", n)
	}
	c, s := p.conns(t) // the one link it may hold
	sendRecv(t, c, s, []int{100})
	other, err := rdma.New(rdma.Config{Provider: p.fab.Host("c", loopGID), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := other.Dial(ctx, p.listener.Addr()); err == nil {
		t.Fatal("a second link was accepted beyond MaxLinks 1")
	}
	if n := p.fab.MRs("b"); n != 1 {
		t.Fatalf("the listener holds %d memory regions, want its one link's", n)
	}
	sendRecv(t, s, c, []int{100})
}

// burst writes n small frames on c while nobody reads s, then reads them
// all and checks each. The link's first slots go out at once; once they
// fill the peer's credit, the next slot waits for it and the frames after
// join that slot, so the burst travels in far fewer slots than frames.
func burst(t *testing.T, c, s *rdma.Conn, n int, seed uint64) {
	t.Helper()
	ctx := testctx.Context(t)
	frame := func(i int) (string, []byte) {
		return fmt.Sprintf("b%d.%d", seed, i), randBytes(int(seed+uint64(i))%200, seed+uint64(i))
	}
	wrote := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			h, p := frame(i)
			if err := c.WriteFrame([]byte(h), p); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the burst's writes did not return while nobody read")
	}
	for i := 0; i < n; i++ {
		h, p, err := readAll(s)
		wh, wp := frame(i)
		if err != nil || h != wh || !bytes.Equal(p, wp) {
			t.Fatalf("frame %d: %q, %d bytes, intact %v, %v", i, h, len(p), bytes.Equal(p, wp), err)
		}
	}
}

// TestPackedSlots: frames written while the slots wait for credit share
// slots, each with its own prefix, and arrive whole and in order.
func TestPackedSlots(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{SlotSize: 32 << 10, Slots: 8, Reserve: 2})
	c, s := p.conns(t)
	const n = 600
	burst(t, c, s, n, 1)
	st := p.dialer.Stats()
	// At most the window's 6 slots of one frame each, the rest packed.
	if st.Packed < n-12 || st.SlotsSent > 12+st.Retransmits {
		t.Errorf("%d frames in %d slots (%d resent), %d packed", n, st.SlotsSent, st.Retransmits, st.Packed)
	}
	// A frame larger than a slot starts in the rest of a waiting slot and
	// continues in whole slots; small ones follow it into its last slot.
	sendRecv(t, c, s, []int{10, 100 << 10, 20, 70 << 10, 0, 5})
	t.Logf("wire %+v, dialer %+v", p.fab.Stats(), p.dialer.Stats())
}

// TestPackedSlotsUnderFaults: a packed slot lost or damaged on the wire is
// refused by the receiver (a lost slot leaves a gap, a flipped bit fails
// the slot's checksum) and sent again whole; no frame is lost, repeated
// or damaged.
func TestPackedSlotsUnderFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    fakeverbs.Faults
	}{
		{"loss", fakeverbs.Faults{Loss: 0.2, From: "a"}},
		{"flips", fakeverbs.Faults{Flip: 0.2, From: "a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, tc.f, rdma.Config{SlotSize: 32 << 10, Slots: 8, Reserve: 2})
			c, s := p.conns(t)
			// Bursts until a packed slot has been sent again (each
			// burst's packed slots go out after the reads start, at
			// 20% faults each).
			for round := uint64(0); p.dialer.Stats().PackedRetransmits == 0; round++ {
				if round == 100 {
					t.Fatalf("no packed slot resent in %d bursts: dialer %+v, wire %+v", round, p.dialer.Stats(), p.fab.Stats())
				}
				burst(t, c, s, 300, 10+round)
			}
			if tc.f.Flip > 0 && p.server.Stats().Corrupt == 0 {
				t.Errorf("flipped bits but no slot refused: %+v", p.server.Stats())
			}
			t.Logf("wire %+v, dialer %+v, server %+v", p.fab.Stats(), p.dialer.Stats(), p.server.Stats())
		})
	}
}

// ackSlot is the size of the companion pair's ack-only slots: a fault
// limited to messages of this size hits acks, credit and probes only.
const ackSlot = 4096

// TestAcksLostOnCompanionPair: acks, credit updates and probes travel on
// the companion queue pair in 4 KiB slots; with a third of them lost or
// bit-flipped, frames still arrive whole and in order both ways (acks
// ride on data slots too, and a lost credit update is asked for by a
// probe).
func TestAcksLostOnCompanionPair(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    fakeverbs.Faults
	}{
		{"lost", fakeverbs.Faults{Loss: 0.3, Bytes: ackSlot}},
		{"flipped", fakeverbs.Faults{Flip: 0.3, Bytes: ackSlot}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, tc.f, rdma.Config{SlotSize: 32 << 10, Slots: 8, Reserve: 2, RTO: 2 * time.Millisecond, MaxRTO: 50 * time.Millisecond})
			c, s := p.conns(t)
			sendRecv(t, c, s, sizes)
			sendRecv(t, s, c, sizes)
			w, d, sv := p.fab.Stats(), p.dialer.Stats(), p.server.Stats()
			if w.Lost+w.Flipped == 0 {
				t.Fatalf("no ack-only slot was lost or flipped: wire %+v", w)
			}
			if d.AcksSent+sv.AcksSent == 0 {
				t.Fatal("no ack-only slots were sent")
			}
			// A flip past an ack-only slot's 64-byte header hits bytes
			// nobody reads; one in the header drops the slot.
			if d.Corrupt+sv.Corrupt > w.Flipped {
				t.Errorf("%d slots flipped on the wire, %d dropped as damaged", w.Flipped, d.Corrupt+sv.Corrupt)
			}
			t.Logf("wire %+v, dialer %+v, server %+v", w, d, sv)
		})
	}
}

// TestCompanionPairDead: when every ack-only slot vanishes (the companion
// pair dead while the data pair and the anchor live), a writer that has
// filled the peer's credit gets no ack and no answer to its probes, and
// the link fails with ErrPeerUnreachable after its bounded retries: it
// neither hangs nor takes the peer for dead.
func TestCompanionPairDead(t *testing.T) {
	ctx := testctx.Context(t)
	p := newPair(t, fakeverbs.Faults{Loss: 1, Bytes: ackSlot}, rdma.Config{SlotSize: 32 << 10, Slots: 8, Reserve: 2,
		RTO: time.Millisecond, MaxRTO: 5 * time.Millisecond, Retries: 5})
	c, s := p.conns(t)
	go func() {
		for {
			if _, _, err := readAll(s); err != nil {
				return
			}
		}
	}()
	werr := make(chan error, 1)
	go func() {
		var err error
		for err == nil {
			err = c.WriteFrame([]byte("h"), make([]byte, 100<<10))
		}
		werr <- err
	}()
	select {
	case err := <-werr:
		if !errors.Is(err, rdma.ErrPeerUnreachable) {
			t.Fatalf("writes with every ack lost: %v, want ErrPeerUnreachable", err)
		}
		t.Logf("%v; wire %+v", err, p.fab.Stats())
	case <-ctx.Done():
		t.Fatal("writes with every ack lost did not fail")
	}
	if w := p.fab.Stats(); w.Lost == 0 || w.Delivered == 0 {
		t.Fatalf("wire %+v: want data slots delivered and ack-only slots lost", w)
	}
}

// TestPostsKeepSequenceOrder: SENDs are posted after the link's mutex is
// released, by whichever writer, reader or poller collected them; with
// many streams writing at once on a clean wire, which keeps order, the
// receiver must still see every slot in sequence: none dropped as out of
// order or duplicate, none resent.
func TestPostsKeepSequenceOrder(t *testing.T) {
	p := newPair(t, fakeverbs.Faults{}, rdma.Config{SlotSize: 16 << 10, Slots: 8, Reserve: 2})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		c, s := p.conns(t)
		wg.Add(2)
		go func() {
			defer wg.Done()
			sendRecv(t, c, s, []int{50000, 10, 16 << 10, 3, 70000, 100})
		}()
		go func() {
			defer wg.Done()
			sendRecv(t, s, c, []int{20000, 1, 40000})
		}()
	}
	wg.Wait()
	for _, st := range []rdma.LinkStats{p.dialer.Stats(), p.server.Stats()} {
		if st.OutOfOrder != 0 || st.Duplicates != 0 || st.Retransmits != 0 || st.Corrupt != 0 {
			t.Fatalf("on a clean wire: %+v", st)
		}
	}
}
