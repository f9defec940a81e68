package kvtransfer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
	"github.com/tandem-inference/tandem/model"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testkit.Isolated(m)) }

var testSecret = []byte("0123456789abcdef-test-secret")

// fast are timeouts short enough for tests that wait on them.
var fast = Timeouts{Handshake: 2 * time.Second, IO: 2 * time.Second, Idle: 1500 * time.Millisecond, KeepAlive: 100 * time.Millisecond}

// suiteTransport is the transport the suites run over: "tcp" (the
// default) or "rdma-fake" (the RDMA link over the in-process fake verbs),
// chosen with KVTRANSFER_TRANSPORT. scripts/test.sh runs them over both.
var suiteTransport = os.Getenv("KVTRANSFER_TRANSPORT")

// onTCP skips a test that needs TCP underneath (a TCP fault proxy, raw
// socket writes) when the suites run over another transport.
func onTCP(t *testing.T) {
	t.Helper()
	if suiteTransport != "" && suiteTransport != "tcp" {
		t.Skipf("needs TCP underneath; the suites run over %s", suiteTransport)
	}
}

var loopGID = verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))

// fakeRDMA returns an RDMA transport on host of fab, closed at the test's
// end.
func fakeRDMA(t *testing.T, fab *fakeverbs.Fabric, host string, cfg rdma.Config) Transport {
	t.Helper()
	cfg.Provider = fab.Host(host, loopGID)
	tr, err := rdma.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return RDMA{T: tr}
}

// rig is a decode group on loopback: one server per rank and the
// pipeline placement of the model's layers over them. client is the
// transport senders and channels dial with.
type rig struct {
	t       *testing.T
	cfg     *model.Config
	servers []*Server
	place   LayerMap
	client  Transport
	fabric  *fakeverbs.Fabric // over rdma-fake
}

func newRig(t *testing.T, name string, ranks int, sc ServerConfig) *rig {
	t.Helper()
	var fab *fakeverbs.Fabric
	if suiteTransport == "rdma-fake" {
		fab = fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
	}
	// 64 slots of 32 KiB (Apple's 512-frame depth, as 16 of 128 KiB): every
	// frame fills at least one slot, and the suites send many small ones.
	return newRigOn(t, name, ranks, sc, fab, rdma.Config{SlotSize: 32 << 10, Slots: 64, Reserve: 8})
}

// newRigOn is newRig over the RDMA link on fab (TCP when fab is nil).
func newRigOn(t *testing.T, name string, ranks int, sc ServerConfig, fab *fakeverbs.Fabric, rc rdma.Config) *rig {
	t.Helper()
	cfg, err := kvtest.Config(name)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, cfg: cfg, client: &TCP{}, fabric: fab}
	if fab != nil {
		r.client = fakeRDMA(t, fab, "prefill", rc)
	}
	var eps []string
	for i := 0; i < ranks; i++ {
		c := sc
		c.Addr = "127.0.0.1:0"
		if fab != nil && c.Transport == nil {
			c.Transport = fakeRDMA(t, fab, fmt.Sprintf("rank%d", i), rc)
		}
		if c.Timeouts == (Timeouts{}) {
			c.Timeouts = fast
		}
		srv, err := Listen(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		r.servers = append(r.servers, srv)
		eps = append(eps, srv.Addr())
	}
	if r.place, err = Contiguous(cfg.NumLayers, eps); err != nil {
		t.Fatal(err)
	}
	return r
}

// expect registers session sid on every rank for its layers.
func (r *rig) expect(sid string, T int, dt model.DType, deadline time.Duration) []*Incoming {
	r.t.Helper()
	var ins []*Incoming
	for _, srv := range r.servers {
		in, err := srv.Expect(ExpectSpec{Session: sid, Secret: testSecret, Model: r.cfg, Layers: r.place.Layers(srv.Addr()),
			Tokens: T, LatentDType: dt, Deadline: time.Now().Add(deadline)})
		if err != nil {
			r.t.Fatal(err)
		}
		ins = append(ins, in)
	}
	return ins
}

// via returns the placement with every endpoint replaced by proxy[endpoint].
func (r *rig) via(addr map[string]string) LayerMap {
	m := LayerMap{}
	for L, ep := range r.place {
		m[L] = addr[ep]
	}
	return m
}

// checkFreed asserts that no server holds buffers or live sessions.
func (r *rig) checkFreed() {
	r.t.Helper()
	for i, srv := range r.servers {
		// A connection's goroutines may still be finishing; sessions and
		// buffers are settled synchronously.
		st := srv.Stats()
		if st.HeldBytes != 0 || st.Sessions != 0 {
			r.t.Errorf("rank %d: %d bytes held, %d live sessions after the transfer", i, st.HeldBytes, st.Sessions)
		}
	}
}

// putAll hands the layers of src to s in a shuffled order from several
// goroutines at once, each handing over a clone (ownership passes).
func putAll(ctx context.Context, t *testing.T, s *Sender, src *model.SeqState, layers []int, seed uint64, workers int) error {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	order := append([]int(nil), layers...)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	ch := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for L := range ch {
				if err := s.PutLayer(ctx, src.Layers[L].Clone()); err != nil {
					errs <- fmt.Errorf("put layer %d: %w", L, err)
					return
				}
			}
		}()
	}
	for _, L := range order {
		ch <- L
	}
	close(ch)
	wg.Wait()
	close(errs)
	return <-errs
}
