package collective

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// BenchmarkAllReduce times one call over loopback TCP (StreamLinks, all
// ranks in this process) for one K3 hidden row (7168 float32, 28 KiB) and
// 16 of them (448 KiB), and, as the limit, "raw": the same bytes moved over
// the same kind of connections in the same pattern (direct exchange, or the
// ring's two passes with its chunks) without framing, checks or sums.
//
//	go test ./decode-worker/collective -run '^$' -bench AllReduce
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		for _, rows := range []int{1, 16} {
			k := rows * 7168
			name := fmt.Sprintf("n=%d/%dKiB", n, 4*k>>10)
			b.Run(name+"/collective", func(b *testing.B) { benchCollective(b, n, k) })
			b.Run(name+"/raw", func(b *testing.B) { benchRaw(b, n, k) })
		}
	}
}

func tcpConns(tb testing.TB, n int) [][]net.Conn {
	conns := make([][]net.Conn, n)
	for r := range conns {
		conns[r] = make([]net.Conn, n)
	}
	for a := range n {
		for bb := a + 1; bb < n; bb++ {
			conns[a][bb], conns[bb][a] = tcpPair(tb)
		}
	}
	tb.Cleanup(func() {
		for _, row := range conns {
			for _, c := range row {
				if c != nil {
					c.Close()
				}
			}
		}
	})
	return conns
}

// runRanks runs each rank's loop of b.N calls and reports µs per call.
func runRanks(b *testing.B, n int, call func(r int) error) {
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Go(func() {
			for range b.N {
				if err := call(r); err != nil {
					errs[r] = err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/call")
}

func benchCollective(b *testing.B, n, k int) {
	gs := groups(b, tcpLinks(b, n), 0)
	bufs := make([][]float32, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for r := range bufs {
		bufs[r] = wide(rng, k)
	}
	b.SetBytes(int64(4 * k))
	ctx := context.Background()
	runRanks(b, n, func(r int) error { return gs[r].AllReduce(ctx, bufs[r]) })
}

func benchRaw(b *testing.B, n, k int) {
	conns := tcpConns(b, n)
	b.SetBytes(int64(4 * k))
	out := make([][]byte, n)
	in := make([][][]byte, n)
	for r := range n {
		out[r] = make([]byte, 8*k)
		in[r] = make([][]byte, n)
		for p := range n {
			in[r][p] = make([]byte, 8*k)
		}
	}
	if n <= DirectMax {
		runRanks(b, n, func(r int) error {
			var wg sync.WaitGroup
			errs := make([]error, 2*n)
			for p := range n {
				if p == r {
					continue
				}
				wg.Go(func() { _, errs[2*p] = conns[r][p].Write(out[r][:4*k]) })
				wg.Go(func() { _, errs[2*p+1] = io.ReadFull(conns[r][p], in[r][p][:4*k]) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return err
				}
			}
			return nil
		})
		return
	}
	chunk := DefaultChunkElems
	chunks := (k + chunk - 1) / chunk
	runRanks(b, n, func(r int) error {
		prev, next, last := conns[r][(r+n-1)%n], conns[r][(r+1)%n], n-1
		for c := range chunks {
			m := min(k, (c+1)*chunk) - c*chunk
			if r > 0 {
				if _, err := io.ReadFull(prev, in[r][0][:8*m]); err != nil {
					return err
				}
			}
			if r < last {
				if _, err := next.Write(out[r][:8*m]); err != nil {
					return err
				}
			}
		}
		for c := range chunks {
			m := min(k, (c+1)*chunk) - c*chunk
			if r != last {
				if _, err := io.ReadFull(prev, in[r][0][:4*m]); err != nil {
					return err
				}
			}
			if (r+1)%n != last {
				if _, err := next.Write(out[r][:4*m]); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
