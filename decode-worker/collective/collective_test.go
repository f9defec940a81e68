package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pipeLinks returns links[r][p], rank r's link to rank p, over net.Pipe
// (synchronous: a send waits for the peer's read).
func pipeLinks(n int) [][]Link {
	links := make([][]Link, n)
	for r := range links {
		links[r] = make([]Link, n)
	}
	for a := range n {
		for b := a + 1; b < n; b++ {
			ca, cb := net.Pipe()
			links[a][b], links[b][a] = NewStreamLink(ca), NewStreamLink(cb)
		}
	}
	return links
}

// tcpLinks returns links over loopback TCP connections.
func tcpLinks(tb testing.TB, n int) [][]Link {
	tb.Helper()
	links := make([][]Link, n)
	for r := range links {
		links[r] = make([]Link, n)
	}
	for a := range n {
		for b := a + 1; b < n; b++ {
			ca, cb := tcpPair(tb)
			links[a][b], links[b][a] = NewStreamLink(ca), NewStreamLink(cb)
		}
	}
	return links
}

func tcpPair(tb testing.TB) (net.Conn, net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	ca, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	rs := <-ch
	if rs.err != nil {
		tb.Fatal(rs.err)
	}
	for _, c := range []net.Conn{ca, rs.c} {
		c.(*net.TCPConn).SetNoDelay(true)
	}
	return ca, rs.c
}

// chaos delays each Send and Recv by a random time, so that frames arrive
// in a different order each run.
type chaos struct {
	Link
	mu  sync.Mutex
	rng *rand.Rand
	max time.Duration
}

func (c *chaos) pause() {
	c.mu.Lock()
	d := time.Duration(c.rng.Int64N(int64(c.max)))
	c.mu.Unlock()
	time.Sleep(d)
}

func (c *chaos) Send(ctx context.Context, f []byte) error {
	c.pause()
	return c.Link.Send(ctx, f)
}

func (c *chaos) Recv(ctx context.Context, b []byte) ([]byte, error) {
	c.pause()
	return c.Link.Recv(ctx, b)
}

func withChaos(links [][]Link, seed uint64, max time.Duration) {
	for r := range links {
		for p, l := range links[r] {
			if l != nil {
				links[r][p] = &chaos{Link: l, rng: rand.New(rand.NewPCG(seed, uint64(r*1000+p))), max: max}
			}
		}
	}
}

func groups(tb testing.TB, links [][]Link, chunk int) []*Group {
	tb.Helper()
	n := len(links)
	gs := make([]*Group, n)
	for r := range gs {
		g, err := New(Config{Rank: r, Ranks: n, Links: links[r], ChunkElems: chunk})
		if err != nil {
			tb.Fatal(err)
		}
		gs[r] = g
		tb.Cleanup(func() { g.Close() })
	}
	return gs
}

// wide returns values over a wide range of magnitudes, with large ones
// that cancel between ranks, so that the float64 sum of the ranks' values,
// rounded to float32, depends on the order of the terms: per element, a
// rank holds +B, -B (B the element's large magnitude, shared by the ranks
// through seed) or a small value.
func wide(rng *rand.Rand, k int) []float32 {
	x := make([]float32, k)
	for i := range x {
		big := math.Ldexp(1, 40+int(mix(uint64(i))%20))
		switch rng.IntN(3) {
		case 0:
			x[i] = float32(big)
		case 1:
			x[i] = float32(-big)
		default:
			x[i] = float32((rng.Float64()*2 - 1) * math.Ldexp(1, rng.IntN(40)-20))
		}
	}
	return x
}

// mix is a fixed hash, so that every rank's element i uses the same large
// magnitude.
func mix(v uint64) uint64 {
	v ^= v >> 33
	v *= 0xff51afd7ed558ccd
	v ^= v >> 33
	return v
}

// rankOrderSum is the contract's sum: float64, rank order, rounded once.
func rankOrderSum(in [][]float32) []float32 {
	out := make([]float32, len(in[0]))
	for i := range out {
		s := float64(in[0][i])
		for _, x := range in[1:] {
			s += float64(x[i])
		}
		out[i] = float32(s)
	}
	return out
}

// allReduce runs one call on every rank, with copies of in, and returns
// each rank's result and error.
func allReduce(ctx context.Context, gs []*Group, in [][]float32) ([][]float32, []error) {
	out := make([][]float32, len(gs))
	errs := make([]error, len(gs))
	var wg sync.WaitGroup
	for r, g := range gs {
		out[r] = append([]float32(nil), in[r]...)
		wg.Go(func() { errs[r] = g.AllReduce(ctx, out[r]) })
	}
	wg.Wait()
	return out, errs
}

func sameBits(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestOrderMatters checks that the test data tell summation orders apart,
// so that the bit-identity tests would catch an order that is not rank
// order.
func TestOrderMatters(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{3, 4, 5, 8} { // two terms commute
		in := make([][]float32, n)
		for r := range in {
			in[r] = wide(rng, 7168)
		}
		rev := make([][]float32, n)
		for r := range rev {
			rev[r] = in[n-1-r]
		}
		if sameBits(rankOrderSum(in), rankOrderSum(rev)) < 0 {
			t.Errorf("n=%d: rank order and reverse order agree on every element", n)
		}
	}
}

// TestAllReduce checks that every rank ends each call with the rank-order
// float64 sum, bit for bit, over synchronous pipes and loopback TCP, with
// random delays on every send and receive.
func TestAllReduce(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 8} {
		for _, tr := range []string{"pipe", "tcp"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, tr), func(t *testing.T) {
				t.Parallel()
				var links [][]Link
				if tr == "pipe" {
					links = pipeLinks(n)
				} else {
					links = tcpLinks(t, n)
				}
				withChaos(links, uint64(n), 300*time.Microsecond)
				gs := groups(t, links, 1000) // ring chunks of 1000: several, the last one short
				rng := rand.New(rand.NewPCG(uint64(n), 7))
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for call, k := range []int{7168, 1, 0, 2500, 7168, 3} {
					in := make([][]float32, n)
					for r := range in {
						in[r] = wide(rng, k)
					}
					if call == 4 { // a signed zero and specials
						for r := range in {
							in[r][0] = float32(math.Copysign(0, -1))
							in[r][1] = float32(math.Inf(1))
						}
					}
					want := rankOrderSum(in)
					out, errs := allReduce(ctx, gs, in)
					for r := range n {
						if errs[r] != nil {
							t.Fatalf("call %d: rank %d: %v", call, r, errs[r])
						}
						if i := sameBits(out[r], want); i >= 0 {
							t.Fatalf("call %d (%d values): rank %d's element %d is %g (%08x), the rank-order sum %g (%08x)",
								call, k, r, i, out[r][i], math.Float32bits(out[r][i]), want[i], math.Float32bits(want[i]))
						}
					}
				}
				if s := gs[0].Stats(); s.Calls != 6 || s.Last <= 0 || s.Max < s.Last || s.Total < s.Max {
					t.Errorf("stats %+v after 6 calls", s)
				}
			})
		}
	}
}

// TestReproducible runs the same inputs many times with different random
// delays and checks every run's bits are the same.
func TestReproducible(t *testing.T) {
	for _, n := range []int{4, 5} {
		rng := rand.New(rand.NewPCG(9, uint64(n)))
		in := make([][]float32, n)
		for r := range in {
			in[r] = wide(rng, 3000)
		}
		var first []float32
		for run := range 8 {
			links := pipeLinks(n)
			withChaos(links, uint64(100*n+run), 200*time.Microsecond)
			gs := groups(t, links, 512)
			out, errs := allReduce(context.Background(), gs, in)
			for r := range n {
				if errs[r] != nil {
					t.Fatal(errs[r])
				}
				if first == nil {
					first = out[r]
				}
				if i := sameBits(out[r], first); i >= 0 {
					t.Fatalf("n=%d run %d rank %d: element %d differs from the first run's", n, run, r, i)
				}
			}
			for _, g := range gs {
				g.Close()
			}
		}
	}
}

// tamper rewrites the frames a link sends on chosen calls.
type tamper struct {
	Link
	calls int
	last  []byte
	edit  func(call int, f, last []byte) []byte
}

func (l *tamper) Send(ctx context.Context, f []byte) error {
	l.calls++
	last := l.last
	l.last = append([]byte(nil), f...)
	return l.Link.Send(ctx, l.edit(l.calls, f, last))
}

// failAll runs calls until they fail on some rank and returns every rank's
// error of that call; it fails the test if one hangs.
func failCall(t *testing.T, gs []*Group, k int, calls int) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range calls {
		in := make([][]float32, len(gs))
		for r := range in {
			in[r] = wide(rng, k)
		}
		_, errs := allReduce(ctx, gs, in)
		if errors.Join(errs...) != nil {
			if ctx.Err() != nil {
				t.Fatalf("the failing call ran into the test's timeout: %v", errs)
			}
			return errs
		}
	}
	t.Fatalf("%d calls succeeded", calls)
	return nil
}

func wantPeerErr(t *testing.T, err error, peer int, text string) {
	t.Helper()
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != peer || !strings.Contains(err.Error(), text) {
		t.Errorf("error %v: want a PeerError naming rank %d and saying %q", err, peer, text)
	}
}

func TestStaleFrame(t *testing.T) {
	for _, n := range []int{2, 5} {
		links := pipeLinks(n)
		// Rank 1 sends its previous frame to rank victim again instead of
		// call 3's first: direct exchange sends one frame a call, the ring
		// (in one chunk) two.
		victim, replay := 0, 3
		if n > DirectMax {
			victim, replay = 2, 5
		}
		links[1][victim] = &tamper{Link: links[1][victim], edit: func(call int, f, last []byte) []byte {
			if call == replay {
				return last
			}
			return f
		}}
		gs := groups(t, links, 1<<20)
		errs := failCall(t, gs, 100, 5)
		wantPeerErr(t, errs[victim], 1, "stale frame of call 2 during call 3")
		if err := gs[victim].AllReduce(context.Background(), make([]float32, 100)); !errors.Is(err, ErrBroken) {
			t.Errorf("n=%d: the call after a failure returned %v, want ErrBroken", n, err)
		}
	}
}

func TestWrongLength(t *testing.T) {
	cases := []struct {
		name string
		edit func(f []byte) []byte
		text string
	}{
		{"long", func(f []byte) []byte { return append(append([]byte(nil), f...), 1, 2, 3, 4) }, "frame longer than expected"},
		{"short", func(f []byte) []byte { return f[:len(f)-4] }, "frame of 396 payload bytes, its header says 400"},
		{"count", func(f []byte) []byte {
			g := append([]byte(nil), f...)
			g[20]--
			return g[:len(g)-4]
		}, "frame of 99 4-byte values, expected 100 4-byte values"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			links := tcpLinks(t, 3)
			links[1][0] = &tamper{Link: links[1][0], edit: func(call int, f, _ []byte) []byte {
				if call == 2 {
					return c.edit(f)
				}
				return f
			}}
			gs := groups(t, links, 0)
			errs := failCall(t, gs, 100, 3)
			wantPeerErr(t, errs[0], 1, c.text)
		})
	}
	t.Run("buffers", func(t *testing.T) {
		gs := groups(t, pipeLinks(2), 0)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, errs := allReduce(ctx, gs, [][]float32{make([]float32, 10), make([]float32, 11)})
		// Whichever rank checks the other's frame first fails on it and
		// closes the link; the other sees the link closed.
		wantPeerErr(t, errs[0], 1, "rank 1: ")
		wantPeerErr(t, errs[1], 0, "rank 0: ")
		if !strings.Contains(errs[0].Error(), "frame longer than expected") &&
			!strings.Contains(errs[1].Error(), "frame of 10 4-byte values, expected 11 4-byte values") {
			t.Errorf("neither rank reports the length: %v; %v", errs[0], errs[1])
		}
	})
}

// TestPeerCloses: a rank closes its links instead of calling; every other
// rank's call fails (none waits forever), and its neighbours name it.
func TestPeerCloses(t *testing.T) {
	for _, n := range []int{3, 5, 8} {
		for _, tr := range []string{"pipe", "tcp"} {
			var links [][]Link
			if tr == "pipe" {
				links = pipeLinks(n)
			} else {
				links = tcpLinks(t, n)
			}
			gs := groups(t, links, 64)
			const dead = 1
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r, g := range gs {
				if r == dead {
					continue
				}
				wg.Go(func() { errs[r] = g.AllReduce(ctx, wide(rand.New(rand.NewPCG(1, 1)), 1000)) })
			}
			time.Sleep(20 * time.Millisecond)
			gs[dead].Close()
			wg.Wait()
			if ctx.Err() != nil {
				t.Fatalf("n=%d %s: a call ran into the test's timeout: %v", n, tr, errs)
			}
			cancel()
			for r, err := range errs {
				if r != dead && err == nil {
					t.Errorf("n=%d %s: rank %d's call succeeded without rank %d", n, tr, r, dead)
				}
			}
			// Every error is a PeerError; the ranks that exchange with the
			// dead one name it (the first to notice closes its own links,
			// so a rank may name that one instead, which names the dead).
			named := false
			for r, err := range errs {
				var pe *PeerError
				if r != dead && !errors.As(err, &pe) {
					t.Errorf("n=%d %s: rank %d: %v, want a PeerError", n, tr, r, err)
				}
				named = named || pe != nil && pe.Peer == dead
			}
			if !named {
				t.Errorf("n=%d %s: no error names rank %d: %v", n, tr, dead, errs)
			}
			t.Logf("n=%d %s: rank %d: %v", n, tr, dead+1, errs[dead+1])
		}
	}
}

func TestCancel(t *testing.T) {
	for _, n := range []int{2, 5} {
		gs := groups(t, tcpLinks(t, n), 0)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		// Only rank 1 calls: it waits for rank 0 until its ctx ends.
		err := gs[1].AllReduce(ctx, make([]float32, 100))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("n=%d: %v, want a deadline error", n, err)
		}
		wantPeerErr(t, err, 0, "receive from rank 0")
		ctx2, cancel2 := context.WithCancel(context.Background())
		cancel2()
		if err := gs[2%n].AllReduce(ctx2, make([]float32, 100)); !errors.Is(err, context.Canceled) {
			t.Errorf("n=%d: a call with a cancelled ctx: %v", n, err)
		}
	}
}

func TestConfig(t *testing.T) {
	links := pipeLinks(3)
	for _, c := range []Config{
		{Rank: 0, Ranks: 0},
		{Rank: 3, Ranks: 3, Links: links[0]},
		{Rank: 0, Ranks: 3, Links: links[0][:2]},
		{Rank: 0, Ranks: 3, Links: []Link{nil, links[0][1], nil}},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
	for _, r := range links {
		for _, l := range r {
			if l != nil {
				l.Close()
			}
		}
	}
}

// TestDeadlineCleared: a call under a deadline, then one without, after
// the deadline passed: the first's deadline must not linger on the links.
func TestDeadlineCleared(t *testing.T) {
	for _, n := range []int{2, 5} {
		gs := groups(t, tcpLinks(t, n), 0)
		in := make([][]float32, n)
		for r := range in {
			in[r] = make([]float32, 100)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second/10)
		if _, errs := allReduce(ctx, gs, in); errors.Join(errs...) != nil {
			t.Fatal(errs)
		}
		<-ctx.Done()
		cancel()
		if _, errs := allReduce(context.Background(), gs, in); errors.Join(errs...) != nil {
			t.Fatalf("n=%d: %v", n, errs)
		}
	}
}

// TestViewF32 covers both the in-place view and the copy of a misaligned
// payload.
func TestViewF32(t *testing.T) {
	want := []float32{1.5, -2, float32(math.Inf(-1))}
	raw := make([]byte, 1+4*len(want))
	for _, off := range []int{0, 1} {
		p := raw[off : off+4*len(want)]
		putF32(p, want)
		got := viewF32(nil, p, len(want))
		if sameBits(got, want) >= 0 {
			t.Errorf("offset %d: %v, want %v", off, got, want)
		}
	}
}
