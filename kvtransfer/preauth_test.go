package kvtransfer

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

// slotHolder keeps n connections from its own loopback address open
// without ever authenticating: it reads the CHALLENGE and waits, and dials
// again as soon as the server drops one (at the handshake timeout), so the
// slots it holds stay held for as long as it runs.
type slotHolder struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted chan struct{} // one per connection that got a CHALLENGE
	refused  chan struct{} // one per connection closed before a CHALLENGE
}

func holdSlots(t *testing.T, local, addr string, n int) *slotHolder {
	h := &slotHolder{stop: make(chan struct{}), conns: map[net.Conn]struct{}{},
		accepted: make(chan struct{}, 1<<16), refused: make(chan struct{}, 1<<16)}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 2 * time.Second}
	for range n {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			buf := make([]byte, 4096)
			for {
				select {
				case <-h.stop:
					return
				default:
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					t.Errorf("dial from %s: %v", local, err)
					return
				}
				h.mu.Lock()
				h.conns[c] = struct{}{}
				h.mu.Unlock()
				k, _ := c.Read(buf)
				if k > 0 {
					h.accepted <- struct{}{}
					for {
						if _, err := c.Read(buf); err != nil {
							break // the server gave the slot up; take it again
						}
					}
				} else {
					h.refused <- struct{}{}
				}
				h.mu.Lock()
				delete(h.conns, c)
				h.mu.Unlock()
				c.Close()
				if k == 0 {
					// Refused: try again soon, without spinning (the
					// peer wants slots, not the server's CPU).
					select {
					case <-h.stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		}()
	}
	return h
}

func (h *slotHolder) close() {
	close(h.stop)
	h.mu.Lock()
	for c := range h.conns {
		c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// TestSlotHoldingPeerDoesNotStarveTransfers: a peer holding many
// unauthenticated connections open from one address gets no more than its
// share of the handshake slots, so a job's transfer from another address
// takes less than a second longer than the same transfer on an idle server.
func TestSlotHoldingPeerDoesNotStarveTransfers(t *testing.T) {
	// Raw TCP connections hold the slots, and the sender dials TCP.
	onTCP(t)
	r := newRig(t, "tiny", 1, ServerConfig{}) // the default limits
	srv := r.servers[0]
	all := kvtest.AllLayers(r.cfg.NumLayers)
	const T = 40
	src := kvtest.RandomSeq(r.cfg, all, T, model.BF16, 1)
	transfer := func(sid string) time.Duration {
		t.Helper()
		start := time.Now()
		in := r.expect(sid, T, model.BF16, 20*time.Second)[0]
		s, err := NewSender(SenderConfig{Session: sid, Secret: testSecret, Placement: r.place, Conns: 2,
			Deadline: time.Now().Add(20 * time.Second), Timeouts: fast})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := putAll(ctx, t, s, src, all, 1, 2); err != nil {
			s.Abort(err)
			t.Fatal(err)
		}
		if err := s.Close(ctx, T); err != nil {
			t.Fatal(err)
		}
		st, err := in.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := kvtest.Diff(src, st, all); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	baseline := transfer("idle")

	// 100 connections from 127.0.0.2: more than every slot the server has.
	h := holdSlots(t, "127.0.0.2", srv.Addr(), 100)
	defer h.close()
	// The attack is in place once the holder has every slot it can get
	// and is being refused more.
	held := 0
	for deadline := time.After(10 * time.Second); held < srv.slots.perSource; held++ {
		select {
		case <-h.accepted:
		case <-deadline:
			t.Fatalf("the holder got %d connections through", held)
		}
	}
	select {
	case <-h.refused:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder was never refused")
	}
	attacked := transfer("attacked")
	t.Logf("transfer on an idle server %v, while a peer holds its handshake slots %v", baseline, attacked)
	if attacked-baseline > time.Second {
		t.Fatalf("a slot-holding peer delayed the transfer by %v (idle %v, attacked %v)", attacked-baseline, baseline, attacked)
	}
}

func TestPreAuthSlots(t *testing.T) {
	p := preAuthSlots{max: 3, perSource: 2, bySource: map[string]int{}}
	if !p.take("a") || !p.take("a") || p.take("a") {
		t.Fatal("a source gets its share and no more")
	}
	if !p.take("b") || p.take("c") {
		t.Fatal("the total is bounded too")
	}
	p.give("a")
	if !p.take("c") || p.take("a") {
		t.Fatal("a slot given back goes to whoever asks first")
	}
	p.give("a")
	p.give("b")
	p.give("c")
	if p.total != 0 || len(p.bySource) != 0 {
		t.Fatalf("left %d slots, %v", p.total, p.bySource)
	}
	for addr, want := range map[string]string{"127.0.0.2:5555": "127.0.0.2", "[::1]:80": "::1", "pipe": "pipe"} {
		if got := sourceOf(addr); got != want {
			t.Errorf("sourceOf(%q) = %q, want %q", addr, got, want)
		}
	}
}
