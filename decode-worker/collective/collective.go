package collective

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DirectMax is the most ranks that use direct exchange; larger groups use
// the ring.
const DirectMax = 4

// DefaultChunkElems is the ring's default chunk, in elements.
const DefaultChunkElems = 2048

// ErrBroken is returned by the calls after one that failed.
var ErrBroken = errors.New("collective: group broken by an earlier error")

// Config configures one rank's side of a group.
type Config struct {
	Rank  int
	Ranks int
	// Links[r] is the link to rank r; Links[Rank] is unused. With up to
	// DirectMax ranks every peer's link is needed; above, only the ring's:
	// rank Rank-1's and rank Rank+1's (modulo Ranks). The group owns the
	// links and closes them.
	Links []Link
	// ChunkElems is the ring's chunk in elements (default
	// DefaultChunkElems); it does not change the results.
	ChunkElems int
}

// Stats are a group's call latencies, each from the call's start until its
// buffer holds the result.
type Stats struct {
	Calls uint64 // calls that succeeded
	Last  time.Duration
	Total time.Duration
	Max   time.Duration
}

// PeerError is a call's failure, and the peer it concerns.
type PeerError struct {
	Rank, Ranks int    // the rank that reports it
	Seq         uint64 // the call
	Peer        int
	Op          string // "send to", "receive from"
	Err         error
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("collective: rank %d of %d, call %d: %s rank %d: %v", e.Rank, e.Ranks, e.Seq, e.Op, e.Peer, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// Group is one rank's side of an all-reduce group. Its calls are serialized;
// Stats and Close may be called at any time.
type Group struct {
	rank, n int
	links   []Link
	chunk   int

	mu  sync.Mutex // one call at a time; guards what follows
	seq uint64
	err error
	tx  []byte      // the outgoing frame
	rx  [][]byte    // received frames, by peer (direct) or [0] (ring)
	val [][]float32 // received values, by rank (direct)
	acc []float64   // the ring's partial sums

	smu   sync.Mutex
	stats Stats

	closeOnce sync.Once
}

// New returns rank cfg.Rank's side of a group.
func New(cfg Config) (*Group, error) {
	n, r := cfg.Ranks, cfg.Rank
	if n < 1 || r < 0 || r >= n || n > 1<<16 {
		return nil, fmt.Errorf("collective: rank %d of %d", r, n)
	}
	if len(cfg.Links) != n {
		return nil, fmt.Errorf("collective: rank %d of %d: %d links, one per rank needed", r, n, len(cfg.Links))
	}
	for _, p := range peersOf(r, n) {
		if cfg.Links[p] == nil {
			return nil, fmt.Errorf("collective: rank %d of %d: no link to rank %d", r, n, p)
		}
	}
	g := &Group{rank: r, n: n, links: cfg.Links, chunk: cfg.ChunkElems}
	if g.chunk <= 0 {
		g.chunk = DefaultChunkElems
	}
	return g, nil
}

// peersOf is the ranks rank r of n exchanges with.
func peersOf(r, n int) []int {
	if n == 1 {
		return nil
	}
	if n <= DirectMax {
		var ps []int
		for p := range n {
			if p != r {
				ps = append(ps, p)
			}
		}
		return ps
	}
	return []int{(r + n - 1) % n, (r + 1) % n}
}

// Rank is the group's rank; Ranks its size.
func (g *Group) Rank() int  { return g.rank }
func (g *Group) Ranks() int { return g.n }

// Stats returns the group's call latencies.
func (g *Group) Stats() Stats {
	g.smu.Lock()
	defer g.smu.Unlock()
	return g.stats
}

// Close closes the group's links; later calls fail.
func (g *Group) Close() error {
	var err error
	g.closeOnce.Do(func() {
		for _, p := range peersOf(g.rank, g.n) {
			err = errors.Join(err, g.links[p].Close())
		}
	})
	return err
}

// AllReduce replaces buf with the element-wise sum of every rank's buf, in
// the order the package documentation states. Every rank must call it with a
// buffer of the same length. A peer that stalls without closing its link
// holds the call until ctx ends: give ctx a deadline to bound it.
func (g *Group) AllReduce(ctx context.Context, buf []float32) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return fmt.Errorf("%w: %w", ErrBroken, g.err)
	}
	if uint64(len(buf)) > 1<<31 {
		return fmt.Errorf("collective: a buffer of %d values", len(buf))
	}
	start := time.Now()
	g.seq++
	var err error
	switch {
	case g.n == 1:
		err = ctx.Err()
	case g.n <= DirectMax:
		err = g.direct(ctx, buf)
	default:
		err = g.ring(ctx, buf)
	}
	if err != nil {
		g.err = err
		g.Close()
		return err
	}
	d := time.Since(start)
	g.smu.Lock()
	g.stats.Calls++
	g.stats.Last = d
	g.stats.Total += d
	g.stats.Max = max(g.stats.Max, d)
	g.smu.Unlock()
	return nil
}

func (g *Group) peerErr(peer int, op string, err error) error {
	return &PeerError{Rank: g.rank, Ranks: g.n, Seq: g.seq, Peer: peer, Op: op, Err: err}
}

// send sends frame to peer.
func (g *Group) send(ctx context.Context, peer int, frame []byte) error {
	if err := g.links[peer].Send(ctx, frame); err != nil {
		return g.peerErr(peer, "send to", err)
	}
	return nil
}

// recv receives the frame want describes from peer into *buf (grown to the
// expected size, never to a size the peer announces), and returns its
// payload.
func (g *Group) recv(ctx context.Context, peer int, want *header, buf *[]byte) ([]byte, error) {
	need := headerLen + int(want.count)*int(want.size)
	if cap(*buf) < need {
		*buf = make([]byte, need)
	}
	frame, err := g.links[peer].Recv(ctx, (*buf)[:need])
	if err != nil {
		return nil, g.peerErr(peer, "receive from", err)
	}
	p, err := check(frame, want)
	if err != nil {
		return nil, g.peerErr(peer, "receive from", err)
	}
	return p, nil
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// direct sends buf to every peer, receives theirs, and sums them all in rank
// order.
func (g *Group) direct(ctx context.Context, buf []float32) error {
	n := len(buf)
	g.tx = grow(g.tx, headerLen+4*n)
	(&header{seq: g.seq, from: g.rank, pass: passDirect, size: 4, count: uint32(n)}).put(g.tx)
	putF32(g.tx[headerLen:], buf)
	if len(g.rx) != g.n {
		g.rx = make([][]byte, g.n)
		g.val = make([][]float32, g.n)
	}

	// The first failure closes the links, which ends the other sends and
	// receives (cheaper than a context of their own for every call).
	var (
		wg    sync.WaitGroup
		emu   sync.Mutex
		first error
	)
	fail := func(err error) {
		emu.Lock()
		if first == nil {
			first = err
			g.Close()
		}
		emu.Unlock()
	}
	for p := range g.n {
		if p == g.rank {
			continue
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := g.send(ctx, p, g.tx); err != nil {
				fail(err)
			}
		}()
		go func() {
			defer wg.Done()
			want := header{seq: g.seq, from: p, pass: passDirect, size: 4, count: uint32(n)}
			pl, err := g.recv(ctx, p, &want, &g.rx[p])
			if err != nil {
				fail(err)
				return
			}
			g.val[p] = viewF32(g.val[p], pl, n)
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	g.val[g.rank] = buf
	sumRankOrder(buf, g.val)
	g.val[g.rank] = nil
	return nil
}

// sumRankOrder sets dst[i] to the float64 sum of src[0][i], src[1][i], ...
// in that order, rounded to float32. dst may be one of src.
func sumRankOrder(dst []float32, src [][]float32) {
	switch len(src) {
	case 2:
		a, b := src[0][:len(dst)], src[1][:len(dst)]
		for i := range dst {
			dst[i] = float32(float64(a[i]) + float64(b[i]))
		}
	case 3:
		a, b, c := src[0][:len(dst)], src[1][:len(dst)], src[2][:len(dst)]
		for i := range dst {
			dst[i] = float32(float64(a[i]) + float64(b[i]) + float64(c[i]))
		}
	case 4:
		a, b, c, d := src[0][:len(dst)], src[1][:len(dst)], src[2][:len(dst)], src[3][:len(dst)]
		for i := range dst {
			dst[i] = float32(float64(a[i]) + float64(b[i]) + float64(c[i]) + float64(d[i]))
		}
	default:
		for i := range dst {
			s := float64(src[0][i])
			for _, x := range src[1:] {
				s += float64(x[i])
			}
			dst[i] = float32(s)
		}
	}
}

// ring runs the reduce pass (float64 partial sums from rank 0 to rank n-1)
// and the broadcast pass (rank n-1's final values to rank 0 and on to rank
// n-2), chunk by chunk.
func (g *Group) ring(ctx context.Context, buf []float32) error {
	n, last := len(buf), g.n-1
	prev, next := (g.rank+g.n-1)%g.n, (g.rank+1)%g.n
	chunks := max(1, (n+g.chunk-1)/g.chunk)
	g.tx = grow(g.tx, headerLen+8*min(n, g.chunk))
	g.acc = grow(g.acc, min(n, g.chunk))
	if len(g.rx) != 1 {
		g.rx = make([][]byte, 1)
	}

	// Reduce.
	for k := range chunks {
		lo, hi := k*g.chunk, min(n, (k+1)*g.chunk)
		x, acc := buf[lo:hi], g.acc[:hi-lo]
		if g.rank == 0 {
			for i, v := range x {
				acc[i] = float64(v)
			}
		} else {
			want := header{seq: g.seq, from: prev, pass: passReduce, size: 8, chunk: uint32(k), count: uint32(hi - lo)}
			pl, err := g.recv(ctx, prev, &want, &g.rx[0])
			if err != nil {
				return err
			}
			getF64(acc, pl)
			for i, v := range x {
				acc[i] += float64(v)
			}
		}
		if g.rank == last {
			for i, s := range acc {
				x[i] = float32(s)
			}
			continue
		}
		f := g.tx[:headerLen+8*(hi-lo)]
		(&header{seq: g.seq, from: g.rank, pass: passReduce, size: 8, chunk: uint32(k), count: uint32(hi - lo)}).put(f)
		putF64(f[headerLen:], acc)
		if err := g.send(ctx, next, f); err != nil {
			return err
		}
	}

	// Broadcast.
	for k := range chunks {
		lo, hi := k*g.chunk, min(n, (k+1)*g.chunk)
		x := buf[lo:hi]
		h := header{seq: g.seq, from: g.rank, pass: passBcast, size: 4, chunk: uint32(k), count: uint32(hi - lo)}
		f := g.tx[:headerLen+4*(hi-lo)]
		if g.rank == last {
			h.put(f)
			putF32(f[headerLen:], x)
		} else {
			want := h
			want.from = prev
			pl, err := g.recv(ctx, prev, &want, &g.rx[0])
			if err != nil {
				return err
			}
			getF32(x, pl)
			if next == last {
				continue
			}
			h.put(f)
			copy(f[headerLen:], pl)
		}
		if err := g.send(ctx, next, f); err != nil {
			return err
		}
	}
	return nil
}

// Peers returns the ranks that rank of a group of ranks exchanges with:
// every other rank up to DirectMax ranks, its ring neighbours above (the
// links Connect opens).
func Peers(rank, ranks int) []int { return peersOf(rank, ranks) }
