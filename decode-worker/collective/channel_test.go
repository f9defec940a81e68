package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

var testSecret = []byte("collective-test-secret-0123456789")

// channelGroups connects n ranks over kvtransfer channels, on TCP or, with
// fabric set, on the RDMA transport over fake verbs.
func channelGroups(tb testing.TB, n int, fabric *fakeverbs.Fabric) []*Group {
	tb.Helper()
	trs := make([]kvtransfer.Transport, n)
	srvs := make([]*kvtransfer.Server, n)
	addrs := make([]string, n)
	for r := range n {
		if fabric != nil {
			t, err := rdma.New(rdma.Config{Provider: fabric.Host(fmt.Sprintf("rank%d", r), verbs.GIDFromIP(net.IPv4(127, 0, 0, 1)))})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { t.Close() })
			trs[r] = kvtransfer.RDMA{T: t}
		}
		srv, err := kvtransfer.Listen(kvtransfer.ServerConfig{Addr: "127.0.0.1:0", Transport: trs[r]})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { srv.Close() })
		srvs[r], addrs[r] = srv, srv.Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gs := make([]*Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			links, err := Connect(ctx, ConnectConfig{Group: "g", Rank: r, Ranks: n, Server: srvs[r], Addrs: addrs, Secret: testSecret, Transport: trs[r]})
			if err != nil {
				errs[r] = err
				return
			}
			gs[r], errs[r] = New(Config{Rank: r, Ranks: n, Links: links, ChunkElems: 1000})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			tb.Fatalf("rank %d: %v", r, err)
		}
		tb.Cleanup(func() { gs[r].Close() })
	}
	return gs
}

// TestChannels runs the collective over authenticated kvtransfer channels,
// on TCP and on the RDMA link (fake verbs), with the same code. With -short
// the RDMA link runs only under KVTRANSFER_TRANSPORT=rdma-fake, as
// scripts/test.sh sets it (the arm64 run under emulation leaves it out, as it
// leaves out kvtransfer/rdma, whose heartbeats expire there).
func TestChannels(t *testing.T) {
	trs := []string{"tcp", "rdma-fake"}
	if testing.Short() && os.Getenv("KVTRANSFER_TRANSPORT") != "rdma-fake" {
		trs = trs[:1]
	}
	for _, tr := range trs {
		for _, n := range []int{1, 3, 5} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				var fabric *fakeverbs.Fabric
				if tr == "rdma-fake" {
					fabric = fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
				}
				gs := channelGroups(t, n, fabric)
				rng := rand.New(rand.NewPCG(5, uint64(n)))
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				for call := range 3 {
					in := make([][]float32, n)
					for r := range in {
						in[r] = wide(rng, 7168)
					}
					want := rankOrderSum(in)
					out, errs := allReduce(ctx, gs, in)
					for r := range n {
						if errs[r] != nil {
							t.Fatalf("call %d rank %d: %v", call, r, errs[r])
						}
						if i := sameBits(out[r], want); i >= 0 {
							t.Fatalf("call %d rank %d: element %d differs from the rank-order sum", call, r, i)
						}
					}
				}
			})
		}
	}
}

// TestConnectWrongSecret: a rank with another secret is not connected.
func TestConnectWrongSecret(t *testing.T) {
	srv, err := kvtransfer.Listen(kvtransfer.ServerConfig{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Connect(ctx, ConnectConfig{Group: "g", Rank: 1, Ranks: 2, Server: srv, Addrs: []string{"unused", srv.Addr()}, Secret: testSecret})
		done <- err
	}()
	_, err = Connect(ctx, ConnectConfig{Group: "g", Rank: 0, Ranks: 2, Addrs: []string{"unused", srv.Addr()}, Secret: []byte("another-secret-of-enough-length")})
	if err == nil {
		t.Fatal("connected with the wrong secret")
	}
	t.Log(err)
	cancel()
	if err := <-done; err == nil {
		t.Fatal("accepted the wrong secret")
	}
}
