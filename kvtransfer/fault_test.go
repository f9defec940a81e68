package kvtransfer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/faultproxy"
	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

// proxies puts a fault proxy in front of every rank and returns the
// placement through them.
func (r *rig) proxies(f faultproxy.Faults, seed uint64) (LayerMap, []*faultproxy.Proxy) {
	r.t.Helper()
	onTCP(r.t) // a TCP proxy; rdma_test.go injects faults into the fake wire
	addr := map[string]string{}
	var ps []*faultproxy.Proxy
	for i, srv := range r.servers {
		p, err := faultproxy.Start(faultproxy.Config{Target: srv.Addr(), Faults: f, Seed: seed + uint64(i)})
		if err != nil {
			r.t.Fatal(err)
		}
		r.t.Cleanup(func() { p.Close() })
		addr[srv.Addr()] = p.Addr()
		ps = append(ps, p)
	}
	return r.via(addr), ps
}

type outcome struct {
	sendErr  error
	states   []*model.SeqState
	waitErrs []error
	stats    SenderStats
}

// transfer streams src over place to the rig's ranks and collects both
// sides' outcomes.
func (r *rig) transfer(sid string, place Placement, src *model.SeqState, conns int, deadline time.Duration, to Timeouts) outcome {
	r.t.Helper()
	ins := r.expect(sid, src.Tokens, model.BF16, deadline)
	s, err := NewSender(SenderConfig{Transport: r.client, Job: "job-" + sid, Session: sid, Secret: testSecret, Placement: place, Conns: conns,
		Deadline: time.Now().Add(deadline), Timeouts: to})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline+5*time.Second)
	defer cancel()
	var o outcome
	all := kvtest.AllLayers(r.cfg.NumLayers)
	if err := putAll(ctx, r.t, s, src, all, 7, 2); err != nil {
		s.Abort(err)
		o.sendErr = err
	} else {
		o.sendErr = s.Close(ctx, src.Tokens)
	}
	o.stats = s.Stats()
	for _, in := range ins {
		st, err := in.Wait(ctx)
		o.states = append(o.states, st)
		o.waitErrs = append(o.waitErrs, err)
	}
	return o
}

// check asserts what every faulty transfer must satisfy: a committed state
// is byte-identical (a corrupted chunk is never committed), a failure is an
// *Error naming the job, and nothing stays allocated on either side.
func (r *rig) check(o outcome, src *model.SeqState, mustSucceed bool) {
	r.t.Helper()
	if o.sendErr != nil {
		var e *Error
		if !errors.As(o.sendErr, &e) || e.Job == "" {
			r.t.Errorf("sender failed without a clear error: %v", o.sendErr)
		}
		if mustSucceed {
			r.t.Errorf("sender: %v", o.sendErr)
		}
	}
	for i, st := range o.states {
		layers := r.place.Layers(r.servers[i].Addr())
		if err := o.waitErrs[i]; err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Job == "" {
				r.t.Errorf("rank %d failed without a clear error: %v", i, err)
			}
			if mustSucceed {
				r.t.Errorf("rank %d: %v", i, err)
			}
			continue
		}
		if err := kvtest.Diff(src, st, layers); err != nil {
			r.t.Errorf("rank %d committed a state that differs from the source: %v", i, err)
		}
	}
	if o.stats.HeldBytes != 0 {
		r.t.Errorf("sender still holds %d bytes", o.stats.HeldBytes)
	}
	r.checkFreed()
}

func smallSeq(t *testing.T, r *rig, T int, seed uint64) *model.SeqState {
	t.Helper()
	return kvtest.RandomSeq(r.cfg, kvtest.AllLayers(r.cfg.NumLayers), T, model.BF16, seed)
}

func TestFaultCuts(t *testing.T) {
	r := newRig(t, "small", 2, ServerConfig{ChunkSize: 16 << 10})
	place, ps := r.proxies(faultproxy.Faults{CutEvery: 400 << 10, MaxFaults: 8}, 1)
	src := smallSeq(t, r, 200, 1)
	o := r.transfer("cuts", place, src, 2, 20*time.Second, fast)
	r.check(o, src, true)
	cuts := ps[0].Stats().Cuts + ps[1].Stats().Cuts
	if cuts == 0 || o.stats.ConnErrors == 0 {
		t.Errorf("no connection was cut (%d cuts, %d sender connection errors): the test proves nothing", cuts, o.stats.ConnErrors)
	}
	t.Logf("%d cuts, sender %+v", cuts, o.stats)
}

func TestFaultBitFlips(t *testing.T) {
	r := newRig(t, "small", 2, ServerConfig{ChunkSize: 16 << 10})
	place, ps := r.proxies(faultproxy.Faults{FlipEvery: 256 << 10, MaxFaults: 12}, 2)
	src := smallSeq(t, r, 200, 2)
	o := r.transfer("flips", place, src, 2, 20*time.Second, fast)
	r.check(o, src, true)
	flips := ps[0].Stats().Flips + ps[1].Stats().Flips
	var crc int64
	for _, srv := range r.servers {
		crc += srv.Stats().ChecksumFailures
	}
	if flips == 0 || crc == 0 {
		t.Errorf("%d bits flipped, %d chunks failed their checksum: the test proves nothing", flips, crc)
	}
	t.Logf("%d flips, %d checksum failures, sender %+v", flips, crc, o.stats)
}

// TestFaultStalls truncates traffic mid-frame and leaves the connection open
// and silent: only the idle timeouts can notice.
func TestFaultStalls(t *testing.T) {
	to := Timeouts{Handshake: time.Second, IO: time.Second, Idle: 400 * time.Millisecond, KeepAlive: 50 * time.Millisecond}
	r := newRig(t, "small", 1, ServerConfig{ChunkSize: 16 << 10, Timeouts: to})
	place, ps := r.proxies(faultproxy.Faults{StallEvery: 1 << 20, MaxFaults: 2}, 3)
	src := smallSeq(t, r, 200, 3)
	o := r.transfer("stalls", place, src, 2, 20*time.Second, to)
	r.check(o, src, true)
	if ps[0].Stats().Stalls == 0 {
		t.Error("nothing was stalled: the test proves nothing")
	}
}

// TestFaultReorder gives every connection its own latency, so chunks sent
// later on one connection arrive before chunks sent earlier on another.
func TestFaultReorder(t *testing.T) {
	r := newRig(t, "small", 2, ServerConfig{ChunkSize: 8 << 10})
	place, _ := r.proxies(faultproxy.Faults{Latency: time.Millisecond, Jitter: 30 * time.Millisecond}, 4)
	src := smallSeq(t, r, 100, 4)
	o := r.transfer("reorder", place, src, 4, 20*time.Second, fast)
	r.check(o, src, true)
}

// TestFaultMatrix mixes every fault at random rates: each transfer either
// completes byte-identical or fails with a clear error, never commits a
// corrupted chunk and leaks nothing.
func TestFaultMatrix(t *testing.T) {
	seeds := 4
	if testing.Short() {
		seeds = 2
	}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			to := Timeouts{Handshake: time.Second, IO: time.Second, Idle: 500 * time.Millisecond, KeepAlive: 50 * time.Millisecond}
			r := newRig(t, "small", 1+rng.IntN(3), ServerConfig{ChunkSize: 8<<10 + rng.IntN(32<<10), Timeouts: to})
			f := faultproxy.Faults{
				CutEvery:   int64(200<<10 + rng.IntN(1<<20)),
				FlipEvery:  int64(100<<10 + rng.IntN(1<<20)),
				StallEvery: int64(2<<20 + rng.IntN(4<<20)),
				Latency:    time.Duration(rng.IntN(2)) * time.Millisecond,
				Jitter:     time.Duration(rng.IntN(10)) * time.Millisecond,
				MaxFaults:  int64(4 + rng.IntN(8)),
				Downstream: rng.IntN(2) == 0,
			}
			place, _ := r.proxies(f, seed)
			src := smallSeq(t, r, 50+rng.IntN(300), seed)
			o := r.transfer(fmt.Sprintf("matrix-%d", seed), place, src, 1+rng.IntN(3), 20*time.Second, to)
			r.check(o, src, false)
			t.Logf("faults %+v: sender %v, sender stats %+v", f, o.sendErr, o.stats)
		})
	}
}

// TestFaultsForever cuts connections faster than anything can get through:
// the transfer must fail at its deadline on both sides, naming the job, a
// layer and the peer, and free everything.
func TestFaultsForever(t *testing.T) {
	r := newRig(t, "small", 1, ServerConfig{ChunkSize: 16 << 10})
	place, _ := r.proxies(faultproxy.Faults{CutEvery: 4 << 10}, 5)
	src := smallSeq(t, r, 100, 5)
	o := r.transfer("forever", place, src, 2, 700*time.Millisecond, fast)
	r.check(o, src, false)
	var e *Error
	if !errors.As(o.sendErr, &e) || e.Layer < 0 || e.Peer == "" {
		t.Fatalf("sender error does not name layer and peer: %v", o.sendErr)
	}
	if !errors.Is(o.sendErr, ErrDeadline) {
		t.Errorf("sender error is not a deadline: %v", o.sendErr)
	}
	werr := o.waitErrs[0]
	if !errors.As(werr, &e) || e.Layer < 0 || !errors.Is(werr, ErrDeadline) {
		t.Errorf("receiver error does not name the layer or is not a deadline: %v", werr)
	}
	t.Logf("sender: %v\nreceiver: %v", o.sendErr, werr)
}
