package kvtransfer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testSecret = []byte("0123456789abcdef-test-secret")

// fast are timeouts short enough for tests that wait on them.
var fast = Timeouts{Handshake: 2 * time.Second, IO: 2 * time.Second, Idle: 1500 * time.Millisecond, KeepAlive: 100 * time.Millisecond}

// rig is a decode group on loopback: one server per rank and the
// pipeline placement of the model's layers over them.
type rig struct {
	t       *testing.T
	cfg     *model.Config
	servers []*Server
	place   LayerMap
}

func newRig(t *testing.T, name string, ranks int, sc ServerConfig) *rig {
	t.Helper()
	cfg, err := kvtest.Config(name)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, cfg: cfg}
	var eps []string
	for i := 0; i < ranks; i++ {
		c := sc
		c.Addr = "127.0.0.1:0"
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
