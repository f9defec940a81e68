package faultproxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sink is a target that records everything each connection sends and
// echoes a short greeting first. received counts the bytes read so far,
// over all connections.
type sink struct {
	ln       net.Listener
	got      chan []byte
	received atomic.Int64
}

func newSink(t *testing.T) *sink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{ln: ln, got: make(chan []byte, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("hi"))
				var b []byte
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					b = append(b, buf[:n]...)
					s.received.Add(int64(n))
					if err != nil {
						break
					}
				}
				s.got <- b
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return s
}

func start(t *testing.T, target string, f Faults) *Proxy {
	t.Helper()
	p, err := Start(Config{Target: target, Faults: f, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func send(t *testing.T, addr string, data []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	hi := make([]byte, 2)
	if _, err := io.ReadFull(c, hi); err != nil || string(hi) != "hi" {
		t.Fatalf("greeting through the proxy: %q %v", hi, err)
	}
	c.Write(data)
	return c
}

func random(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(b)
	return b
}

func TestForwardsIntact(t *testing.T) {
	s := newSink(t)
	p := start(t, s.ln.Addr().String(), Faults{})
	data := random(1 << 20)
	c := send(t, p.Addr(), data)
	c.Close()
	if got := <-s.got; !bytes.Equal(got, data) {
		t.Fatalf("forwarded %d bytes, differing", len(got))
	}
	if st := p.Stats(); st.BytesUp != 1<<20 || st.BytesDown != 2 || st.Conns != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRateAndLatency: the link cannot go faster than its rate, and nothing
// arrives before the latency.
func TestRateAndLatency(t *testing.T) {
	s := newSink(t)
	p := start(t, s.ln.Addr().String(), Faults{Rate: 4 << 20, Latency: 30 * time.Millisecond})
	start := time.Now()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	hi := make([]byte, 2)
	io.ReadFull(c, hi)
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("greeting arrived after %v, before the 30ms latency", d)
	}
	data := random(1 << 20)
	start = time.Now()
	c.Write(data)
	c.Close()
	got := <-s.got
	if d := time.Since(start); d < 200*time.Millisecond || !bytes.Equal(got, data) {
		t.Errorf("1 MiB at 4 MiB/s took %v (intact: %v)", d, bytes.Equal(got, data))
	}
}

func TestFlips(t *testing.T) {
	s := newSink(t)
	p := start(t, s.ln.Addr().String(), Faults{FlipEvery: 100 << 10, MaxFaults: 3})
	data := random(2 << 20)
	c := send(t, p.Addr(), data)
	c.Close()
	got := <-s.got
	if len(got) != len(data) {
		t.Fatalf("%d bytes forwarded of %d", len(got), len(data))
	}
	bits := 0
	for i := range got {
		for x := got[i] ^ data[i]; x != 0; x &= x - 1 {
			bits++
		}
	}
	if bits != 3 || p.Stats().Flips != 3 {
		t.Fatalf("%d bits differ, %d flips counted; want 3 (MaxFaults)", bits, p.Stats().Flips)
	}
}

func TestCut(t *testing.T) {
	s := newSink(t)
	p := start(t, s.ln.Addr().String(), Faults{CutEvery: 256 << 10, MaxFaults: 1})
	data := random(4 << 20)
	c := send(t, p.Addr(), data)
	defer c.Close()
	got := <-s.got
	if len(got) >= len(data) || !bytes.Equal(got, data[:len(got)]) || p.Stats().Cuts != 1 {
		t.Fatalf("cut: %d of %d bytes forwarded, prefix intact %v, %d cuts", len(got), len(data), bytes.Equal(got, data[:len(got)]), p.Stats().Cuts)
	}
	io.ReadAll(c) // ends: the proxy closed the client side too
}

// TestStall forwards a prefix and then nothing, keeping the connection open.
func TestStall(t *testing.T) {
	s := newSink(t)
	p := start(t, s.ln.Addr().String(), Faults{StallEvery: 64 << 10, MaxFaults: 1})
	data := random(1 << 20)
	c := send(t, p.Addr(), data)
	// The stall happened and everything forwarded before it reached the
	// target: the connection has settled, open and silent.
	deadline := time.Now().Add(10 * time.Second)
	for st := p.Stats(); st.Stalls != 1 || s.received.Load() != st.BytesUp; st = p.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("no settled stall within 10 s: %+v, the target has %d bytes", st, s.received.Load())
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case got := <-s.got:
		t.Fatalf("the target saw the end of a stalled connection (%d bytes)", len(got))
	default:
	}
	if st := p.Stats(); st.BytesUp >= int64(len(data)) || st.Cuts != 0 {
		t.Fatalf("stalled: %+v; want a prefix of the %d bytes forwarded and no cut", st, len(data))
	}
	c.Close()
	p.CutAll()
	if got := <-s.got; len(got) >= len(data) || !bytes.Equal(got, data[:len(got)]) {
		t.Fatalf("stalled: %d bytes forwarded", len(got))
	}
}

// TestJitterReorders sends on a slow connection first and a fast one
// second: with per-connection latency the second arrives first.
func TestJitterReorders(t *testing.T) {
	s := newSink(t)
	p := start(t, s.ln.Addr().String(), Faults{Jitter: 200 * time.Millisecond})
	var conns []net.Conn
	for i := 0; i < 8; i++ {
		conns = append(conns, send(t, p.Addr(), nil))
	}
	for i, c := range conns { // in order, within microseconds
		c.Write([]byte{byte(i)})
		c.Close()
	}
	var order []byte
	for range conns {
		order = append(order, (<-s.got)[0])
	}
	sorted := true
	for i := 1; i < len(order); i++ {
		sorted = sorted && order[i] > order[i-1]
	}
	if sorted {
		t.Fatalf("arrival order %v: no connection overtook another", order)
	}
}
