// Package faultproxy is a TCP proxy that makes a link bad on purpose: it
// limits bandwidth, adds latency, delays connections unequally (so data
// overtakes data sent earlier on another connection), cuts connections at
// random points, flips payload bits and truncates traffic mid-frame leaving
// the connection silent. Transfer fault tests and the end-to-end benchmark
// put it between a sender and a receiver.
package faultproxy

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Faults say what the proxy does to the traffic. They can be changed while
// it runs (SetFaults); a connection takes the values current when its bytes
// pass.
type Faults struct {
	// Rate limits each direction to this many bytes per second, shared by
	// all connections as on one link. Zero means unlimited.
	Rate int64
	// Latency delays every forwarded segment, one way.
	Latency time.Duration
	// Jitter adds to each connection its own extra latency, drawn once in
	// [0, Jitter), so that data sent later on a faster connection arrives
	// before data sent earlier on a slower one.
	Jitter time.Duration
	// CutEvery cuts a connection (closes both sides) after a random number
	// of forwarded bytes averaging CutEvery. Zero means never.
	CutEvery int64
	// StallEvery truncates a direction after a random number of bytes
	// averaging StallEvery: it forwards part of a segment, then nothing
	// more, leaving the connection open and silent. Zero means never.
	StallEvery int64
	// FlipEvery flips one random bit per FlipEvery forwarded bytes on
	// average. Zero means never.
	FlipEvery int64
	// MaxFaults stops cutting, stalling and flipping after that many faults
	// in total (zero: no limit), so that a resuming transfer can finish.
	MaxFaults int64
	// Downstream applies cuts, stalls and flips to the target-to-client
	// direction too; by default only client-to-target traffic is damaged.
	Downstream bool
	// Silent swallows everything both ways while it is set, and keeps
	// every connection open until the proxy closes, even one whose other
	// end closed: a peer that hangs (stopped, wedged) without closing its
	// sockets.
	Silent bool
}

// Config configures a proxy.
type Config struct {
	Listen string // default "127.0.0.1:0"
	Target string // where connections are forwarded
	Faults Faults
	Seed   uint64 // for reproducible faults
}

// Stats count what the proxy did.
type Stats struct {
	Conns     int64 // connections accepted
	Cuts      int64
	Stalls    int64
	Flips     int64
	BytesUp   int64 // forwarded client -> target
	BytesDown int64 // forwarded target -> client
}

// Proxy is a running fault proxy.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	faults Faults
	rng    *rand.Rand
	pairs  map[*pair]struct{}
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup

	up, down bucket
	faultsN  atomic.Int64
	conns    atomic.Int64
	cuts     atomic.Int64
	stalls   atomic.Int64
	flips    atomic.Int64
	bytesUp  atomic.Int64
	bytesDn  atomic.Int64
}

// Start listens and forwards to cfg.Target until Close.
func Start(cfg Config) (*Proxy, error) {
	if cfg.Target == "" {
		return nil, errors.New("faultproxy: no target")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen on %s: %w", cfg.Listen, err)
	}
	p := &Proxy{ln: ln, target: cfg.Target, faults: cfg.Faults, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		pairs: map[*pair]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's listening address: dial it instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetFaults replaces the faults.
func (p *Proxy) SetFaults(f Faults) {
	p.mu.Lock()
	p.faults = f
	p.mu.Unlock()
}

func (p *Proxy) current() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// CutAll closes every current connection.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	pairs := make([]*pair, 0, len(p.pairs))
	for pr := range p.pairs {
		pairs = append(pairs, pr)
	}
	p.mu.Unlock()
	for _, pr := range pairs {
		p.cuts.Add(1)
		pr.close()
	}
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{Conns: p.conns.Load(), Cuts: p.cuts.Load(), Stalls: p.stalls.Load(), Flips: p.flips.Load(),
		BytesUp: p.bytesUp.Load(), BytesDown: p.bytesDn.Load()}
}

// Close stops the proxy, closes every connection and waits for its goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	return err
}

// draw returns a random exponential gap with the given mean, in bytes.
func (p *Proxy) draw(mean int64) int64 {
	if mean <= 0 {
		return math.MaxInt64
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(p.rng.ExpFloat64()*float64(mean)) + 1
}

func (p *Proxy) intn(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.IntN(n)
}

// fault reports whether one more fault may be injected, counting it.
func (p *Proxy) fault(f Faults) bool {
	if f.MaxFaults <= 0 {
		p.faultsN.Add(1)
		return true
	}
	for {
		n := p.faultsN.Load()
		if n >= f.MaxFaults {
			return false
		}
		if p.faultsN.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.done:
				return
			case <-time.After(10 * time.Millisecond):
				continue
			}
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *Proxy) handle(client net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	f := p.current()
	var extra time.Duration
	if f.Jitter > 0 {
		extra = time.Duration(p.intn(int(f.Jitter)))
	}
	pr := &pair{a: client, b: up}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pr.close()
		return
	}
	p.pairs[pr] = struct{}{}
	p.mu.Unlock()
	p.conns.Add(1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		p.pump(pr, client, up, extra, true)
	}()
	go func() {
		defer wg.Done()
		p.pump(pr, up, client, extra, false)
	}()
	wg.Wait()
	pr.close()
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

// pair is a proxied connection: both of its sockets.
type pair struct {
	a, b net.Conn
	once sync.Once
}

func (pr *pair) close() {
	pr.once.Do(func() {
		pr.a.Close()
		pr.b.Close()
	})
}

type segment struct {
	b  []byte
	at time.Time // when it may be delivered
}

// pump forwards src to dst through a delay queue: a reader stamps each
// segment with its delivery time, the writer waits for it and for the rate
// limiter, then damages and writes it.
func (p *Proxy) pump(pr *pair, src, dst net.Conn, extra time.Duration, upstream bool) {
	q := make(chan segment, 64)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- segment{b: b[:n], at: time.Now().Add(p.current().Latency + extra)}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		if p.current().Silent {
			// Silent passes on nothing, not even a close.
			<-p.done
		}
		pr.close()
		for range q { // let the reader finish
		}
	}()
	lim, count := &p.down, &p.bytesDn
	if upstream {
		lim, count = &p.up, &p.bytesUp
	}
	f := p.current()
	untilCut, untilStall, untilFlip := p.draw(f.CutEvery), p.draw(f.StallEvery), p.draw(f.FlipEvery)
	stalled := false
	for s := range q {
		if stalled {
			continue // truncated: swallow everything, the connection stays open
		}
		if d := time.Until(s.at); d > 0 && !p.sleep(d) {
			return
		}
		f = p.current()
		if f.Silent {
			continue
		}
		if f.Rate > 0 && !p.sleep(lim.take(int64(len(s.b)), f.Rate)) {
			return
		}
		b := s.b
		damage := upstream || f.Downstream
		n := int64(len(b))
		if damage && f.FlipEvery > 0 {
			for untilFlip <= n {
				if p.fault(f) {
					i := untilFlip - 1
					b[i] ^= 1 << p.intn(8)
					p.flips.Add(1)
				}
				untilFlip += p.draw(f.FlipEvery)
			}
			untilFlip -= n
		}
		if damage && f.CutEvery > 0 && untilCut <= n && p.fault(f) {
			dst.Write(b[:untilCut-1])
			count.Add(untilCut - 1)
			p.cuts.Add(1)
			return
		}
		if damage && f.StallEvery > 0 && untilStall <= n && p.fault(f) {
			dst.Write(b[:untilStall-1])
			count.Add(untilStall - 1)
			p.stalls.Add(1)
			stalled = true
			continue
		}
		if damage {
			untilCut -= min(n, untilCut-1)
			untilStall -= min(n, untilStall-1)
		}
		if _, err := dst.Write(b); err != nil {
			return
		}
		count.Add(n)
	}
}

// sleep waits d unless the proxy closes first.
func (p *Proxy) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.done:
		return false
	}
}

// bucket paces one direction: each segment is scheduled after the previous
// one at the link rate, with a small burst allowance.
type bucket struct {
	mu   sync.Mutex
	next time.Time
}

const burst = 2 * time.Millisecond

// take reserves n bytes and returns how long to wait before sending them.
func (b *bucket) take(n, rate int64) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if b.next.Before(now.Add(-burst)) {
		b.next = now.Add(-burst)
	}
	b.next = b.next.Add(time.Duration(float64(n) / float64(rate) * float64(time.Second)))
	return time.Until(b.next)
}
