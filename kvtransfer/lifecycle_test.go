package kvtransfer

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/kvtransfer/faultproxy"
	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

func newSender(t *testing.T, tr Transport, sid string, place Placement, mod func(*SenderConfig)) *Sender {
	t.Helper()
	cfg := SenderConfig{Transport: tr, Session: sid, Secret: testSecret, Placement: place, Deadline: time.Now().Add(5 * time.Second), Timeouts: fast}
	if mod != nil {
		mod(&cfg)
	}
	s, err := NewSender(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReceiverDeadline: a sender that stops half way makes the receiver
// fail at its deadline, naming the first incomplete layer and the peer; the
// sender learns it and both sides free their buffers.
func TestReceiverDeadline(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	// The deadline is far, and brought forward once the layers sent are
	// verified: a deadline that passes while they are still on the wire
	// (a loaded machine took over 300 ms for layer 0 over the RDMA link)
	// names an earlier layer.
	in, err := r.servers[0].Expect(ExpectSpec{Job: "job-7", Session: "dl", Secret: testSecret, Model: r.cfg,
		Layers: kvtest.AllLayers(9), Tokens: 5, Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	src := kvtest.RandomSeq(r.cfg, kvtest.AllLayers(9), 5, model.BF16, 1)
	s := newSender(t, r.client, "dl", r.place, func(c *SenderConfig) { c.Deadline = time.Now().Add(time.Hour) })
	ctx := testctx.Context(t)
	sent := []int{0, 1, 2, 4} // layer 3 never comes
	for _, L := range sent {
		if err := s.PutLayer(ctx, src.Layers[L]); err != nil {
			t.Fatal(err)
		}
	}
	for !layersVerified(in, sent) {
		select {
		case <-ctx.Done():
			t.Fatalf("layers %v not verified: %v", sent, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	in.s.timer.Reset(0)
	_, err = in.Wait(ctx)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrDeadline) || e.Job != "job-7" || e.Layer != 3 || e.Peer == "" {
		t.Fatalf("receiver: %v", err)
	}
	err = s.Close(ctx, 5)
	if !errors.Is(err, ErrDeadline) || !errors.As(err, &e) || e.Peer != r.servers[0].Addr() {
		t.Fatalf("sender: %v", err)
	}
	if st := s.Stats(); st.HeldBytes != 0 {
		t.Errorf("sender holds %d bytes", st.HeldBytes)
	}
	r.checkFreed()
}

// layersVerified reports whether every chunk of the layers has been
// verified by the receiving session.
func layersVerified(in *Incoming, layers []int) bool {
	in.s.mu.Lock()
	defer in.s.mu.Unlock()
	for _, rl := range in.s.layers {
		if slices.Contains(layers, rl.L) && rl.missing > 0 {
			return false
		}
	}
	return true
}

// TestSenderDeadlineNoServer: nothing listens at the endpoint; the sender
// fails at its deadline naming the peer and the last connection error.
func TestSenderDeadlineNoServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := newSender(t, &TCP{}, "nobody", LayerMap{0: addr}, func(c *SenderConfig) { c.Deadline = time.Now().Add(300 * time.Millisecond) })
	cfg, _ := kvtest.Config("tiny")
	if err := s.PutLayer(context.Background(), kvtest.RandomSeq(cfg, []int{0}, 3, model.BF16, 1).Layers[0]); err != nil {
		t.Fatal(err)
	}
	err = s.Close(context.Background(), 3)
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrDeadline) || e.Peer != addr || e.Layer != 0 || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("got %v", err)
	}
	if st := s.Stats(); st.HeldBytes != 0 {
		t.Errorf("sender holds %d bytes", st.HeldBytes)
	}
}

func TestAbortReachesReceiver(t *testing.T) {
	r := newRig(t, "tiny", 2, ServerConfig{})
	ins := r.expect("ab", 4, model.BF16, 5*time.Second)
	src := kvtest.RandomSeq(r.cfg, kvtest.AllLayers(9), 4, model.BF16, 1)
	s := newSender(t, r.client, "ab", r.place, nil)
	if err := s.PutLayer(context.Background(), src.Layers[0]); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(testctx.Context(t), t, "the layer sent, on 4 connections", func() bool { return s.Stats().HeldBytes == 0 && s.Stats().Dials == 4 })
	s.Abort(errors.New("prefill ran out of memory"))
	for i, in := range ins {
		_, err := in.Wait(context.Background())
		if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "prefill ran out of memory") {
			t.Errorf("rank %d: %v", i, err)
		}
	}
	if err := s.PutLayer(context.Background(), src.Layers[1]); !errors.Is(err, ErrAborted) {
		t.Errorf("PutLayer after Abort: %v", err)
	}
	r.checkFreed()
}

func TestReceiverCancel(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	ins := r.expect("cx", 4, model.BF16, 5*time.Second)
	src := kvtest.RandomSeq(r.cfg, kvtest.AllLayers(9), 4, model.BF16, 1)
	s := newSender(t, r.client, "cx", r.place, nil)
	if err := s.PutLayer(context.Background(), src.Layers[0]); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(testctx.Context(t), t, "the layer sent", func() bool { return s.Stats().HeldBytes == 0 })
	ins[0].Cancel()
	if err := s.Close(context.Background(), 4); !errors.Is(err, ErrCanceled) {
		t.Fatalf("sender: %v", err)
	}
	if _, err := ins[0].Wait(context.Background()); !errors.Is(err, ErrCanceled) {
		t.Fatalf("receiver: %v", err)
	}
	r.checkFreed()
}

// TestMissingLayer: the sender closes without one layer; the totals of its
// END do not match and both sides name the incomplete layer.
func TestMissingLayer(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	ins := r.expect("miss", 6, model.BF16, 5*time.Second)
	src := kvtest.RandomSeq(r.cfg, kvtest.AllLayers(9), 6, model.BF16, 1)
	s := newSender(t, r.client, "miss", r.place, nil)
	for L := 0; L < 9; L++ {
		if L == 5 {
			continue
		}
		if err := s.PutLayer(context.Background(), src.Layers[L]); err != nil {
			t.Fatal(err)
		}
	}
	err := s.Close(context.Background(), 6)
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "without layers [5]") {
		t.Fatalf("sender: %v", err)
	}
	_, err = ins[0].Wait(context.Background())
	var e *Error
	if !errors.As(err, &e) || e.Layer != 5 {
		t.Fatalf("receiver: %v", err)
	}
	r.checkFreed()
}

// TestWrongTokenCount: the END's token count differs from the admission's.
func TestWrongTokenCount(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	ins := r.expect("tok", 6, model.BF16, 5*time.Second)
	defer ins[0].Cancel()
	cfg := r.cfg
	s := newSender(t, r.client, "tok", r.place, nil)
	for L := 0; L < 9; L++ {
		ls := cfg.NewLayerState(L, model.StateOptions{})
		if ls.Kind == model.MLA {
			ls.Parts[0].Shape[0] = 6
			ls.Parts[0].Data = make([]byte, 6*cfg.LatentWidth()*2)
		}
		if err := s.PutLayer(context.Background(), ls); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(context.Background(), 7); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "for 7 tokens") {
		t.Fatalf("sender: %v", err)
	}
}

// TestBackpressure: with nobody acknowledging, PutLayer blocks once MaxHeld
// bytes are held, until its context ends; the layer is then not taken.
func TestBackpressure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts and never speaks
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg, _ := kvtest.Config("tiny")
	src := kvtest.RandomSeq(cfg, kvtest.AllLayers(9), 4, model.BF16, 1)
	one := int64(src.Layers[0].Bytes())
	s := newSender(t, &TCP{}, "bp", LayerMap{0: ln.Addr().String(), 1: ln.Addr().String()}, func(c *SenderConfig) { c.MaxHeld = one })
	defer s.Abort(errors.New("test over"))
	if err := s.PutLayer(context.Background(), src.Layers[0]); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.PutLayer(ctx, src.Layers[1])
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 90*time.Millisecond {
		t.Fatalf("second layer over the bound: %v after %v", err, time.Since(start))
	}
	if got := s.Stats().HeldBytes; got != one {
		t.Fatalf("holding %d bytes, want %d", got, one)
	}
}

// TestKeepAlive: a sender idle for several idle timeouts (a long prefill
// layer) keeps its connections: pings answered by pongs.
func TestKeepAlive(t *testing.T) {
	// An idle timeout of 2 s: at a load average of 150 on 2 cores the
	// scheduler stalled both ends for more than 400 ms (a connection
	// died, as it should when its peer is that silent).
	to := Timeouts{Handshake: 5 * time.Second, IO: 5 * time.Second, Idle: 2 * time.Second, KeepAlive: 100 * time.Millisecond}
	r := newRig(t, "tiny", 1, ServerConfig{Timeouts: to})
	ins := r.expect("ka", 3, model.BF16, 20*time.Second)
	src := kvtest.RandomSeq(r.cfg, kvtest.AllLayers(9), 3, model.BF16, 1)
	s := newSender(t, r.client, "ka", r.place, func(c *SenderConfig) { c.Timeouts, c.Deadline = to, time.Now().Add(20*time.Second) })
	// Both connections up, then idle until they have traded enough pings
	// to span two idle timeouts: a connection pings at most once per
	// keep-alive interval, so that many pongs took at least that long.
	testkit.WaitFor(testctx.Context(t), t, "both connections up", func() bool { return s.Stats().Dials == 2 })
	idle := time.Now()
	enough := 2 * int64(2*to.Idle/to.KeepAlive)
	for s.Stats().Pongs < enough {
		if time.Since(idle) > time.Minute {
			t.Fatalf("%d pongs in a minute, waiting for %d: %+v", s.Stats().Pongs, enough, s.Stats())
		}
		time.Sleep(to.KeepAlive)
	}
	if st := s.Stats(); st.ConnErrors != 0 || st.ChunksSent != 0 {
		t.Fatalf("idle connections: %+v", st)
	}
	if err := putAll(context.Background(), t, s, src, kvtest.AllLayers(9), 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	if _, err := ins[0].Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Dials != 2 || st.ConnErrors != 0 {
		t.Errorf("connections did not survive the idle time: %+v", st)
	}
}

// TestResumeFromAcked: after every connection is cut, the sender resends
// nothing that was acknowledged.
func TestResumeFromAcked(t *testing.T) {
	r := newRig(t, "small", 1, ServerConfig{ChunkSize: 8 << 10})
	place, ps := r.proxies(faultproxy.Faults{}, 1)
	ins := r.expect("resume", 64, model.BF16, 10*time.Second)
	src := smallSeq(t, r, 64, 1)
	s := newSender(t, r.client, "resume", place, nil)
	ctx := context.Background()
	for L := 0; L < 8; L++ {
		if err := s.PutLayer(ctx, src.Layers[L]); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(testctx.Context(t), t, "the layers sent", func() bool { return s.Stats().HeldBytes == 0 })
	ps[0].CutAll()
	testkit.WaitFor(testctx.Context(t), t, "both connections cut and redialed", func() bool { st := s.Stats(); return st.ConnErrors == 2 && st.Dials == 4 })
	for L := 8; L < r.cfg.NumLayers; L++ {
		if err := s.PutLayer(ctx, src.Layers[L]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(ctx, 64); err != nil {
		t.Fatal(err)
	}
	st, err := ins[0].Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := kvtest.Diff(src, st, kvtest.AllLayers(r.cfg.NumLayers)); err != nil {
		t.Fatal(err)
	}
	if ss := s.Stats(); ss.ChunksResent != 0 || ss.Dials <= 2 {
		t.Errorf("after a cut of acknowledged traffic: %+v", ss)
	}
}

// TestResumeFromReceiverBitmap: chunks the receiver verified from an earlier
// connection (whose acks the sender never saw) are reported in the WELCOME
// and not sent again.
func TestResumeFromReceiverBitmap(t *testing.T) {
	const T = 10
	r, in, rc := maliciousRig(t, "bitmap", T)
	src := kvtest.RandomSeq(r.cfg, []int{3, 4}, T, model.BF16, 3)
	p := &src.Layers[4].Parts[0] // the KDA state: 8 KiB = 128 chunks of 64
	for i := 0; i < 10; i++ {
		d := p.Data[i*64 : (i+1)*64]
		rc.write(dataHeader(uint64(i+1), 4, p.Kind, p.DType, p.Shape, i*64, 64, d), d)
	}
	for seq := uint64(0); seq < 10; {
		a, err := rc.read()
		if err != nil {
			t.Fatal(err)
		}
		seq = a.Seq
	}
	rc.c.Close()
	s := newSender(t, r.client, "bitmap", LayerMap{3: r.servers[0].Addr(), 4: r.servers[0].Addr()}, func(c *SenderConfig) { c.Conns = 1 })
	for _, L := range []int{3, 4} {
		if err := s.PutLayer(context.Background(), src.Layers[L]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(context.Background(), T); err != nil {
		t.Fatal(err)
	}
	st, err := in.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := kvtest.Diff(src, st, []int{3, 4}); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, L := range []int{3, 4} {
		for _, q := range src.Layers[L].Parts {
			total += chunkCount(len(q.Data), 64)
		}
	}
	if got := s.Stats().ChunksSent; got != int64(total-10) {
		t.Errorf("sent %d chunks; %d minus the 10 the receiver had", got, total)
	}
}

// TestCommittedOutcomeOnReconnect: a sender reconnecting after the commit
// (its COMMIT lost) is told so in the WELCOME.
func TestCommittedOutcomeOnReconnect(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	ins := r.expect("late", 2, model.BF16, 5*time.Second)
	src := kvtest.RandomSeq(r.cfg, kvtest.AllLayers(9), 2, model.BF16, 1)
	s := newSender(t, r.client, "late", r.place, nil)
	if err := putAll(context.Background(), t, s, src, kvtest.AllLayers(9), 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := ins[0].Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	rc := dialRaw(t, r.client, r.servers[0].Addr())
	if w := rc.login("late"); !w.Committed {
		t.Fatalf("WELCOME after the commit: %+v", w)
	}
	r.checkFreed()
}

func TestServerCloseFailsSessions(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	ins := r.expect("sc", 2, model.BF16, 5*time.Second)
	rc := dialRaw(t, r.client, r.servers[0].Addr())
	rc.login("sc")
	r.servers[0].Close()
	if _, err := ins[0].Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v", err)
	}
	if _, err := r.servers[0].Expect(ExpectSpec{}); err == nil {
		t.Fatal("Expect on a closed server")
	}
	r.checkFreed()
}

func TestExpectValidation(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	good := ExpectSpec{Session: "v", Secret: testSecret, Model: r.cfg, Layers: []int{0, 3}, Tokens: 4, Deadline: time.Now().Add(time.Second)}
	for _, tc := range []struct {
		name  string
		mod   func(*ExpectSpec)
		wants string
	}{
		{"short secret", func(s *ExpectSpec) { s.Secret = []byte("short") }, "secret"},
		{"no model", func(s *ExpectSpec) { s.Model = nil }, "model"},
		{"no layers", func(s *ExpectSpec) { s.Layers = nil }, "no layers"},
		{"layer range", func(s *ExpectSpec) { s.Layers = []int{9} }, "outside"},
		{"layer twice", func(s *ExpectSpec) { s.Layers = []int{3, 3} }, "twice"},
		{"negative tokens", func(s *ExpectSpec) { s.Tokens = -1 }, "negative"},
		{"dtype", func(s *ExpectSpec) { s.LatentDType = 9 }, "dtype"},
		{"capacity", func(s *ExpectSpec) { s.LatentCapacity = 2 }, "capacity"},
		{"no deadline", func(s *ExpectSpec) { s.Deadline = time.Time{} }, "deadline"},
		{"past deadline", func(s *ExpectSpec) { s.Deadline = time.Now().Add(-time.Second) }, "passed"},
		{"chunk", func(s *ExpectSpec) { s.ChunkSize = MaxChunkSize + 1 }, "chunk"},
	} {
		sp := good
		tc.mod(&sp)
		if _, err := r.servers[0].Expect(sp); err == nil || !strings.Contains(err.Error(), tc.wants) {
			t.Errorf("%s: got %v", tc.name, err)
		}
	}
	in, err := r.servers[0].Expect(good)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Cancel()
	if _, err := r.servers[0].Expect(good); err == nil {
		t.Error("same session expected twice")
	}
}

func TestSenderValidation(t *testing.T) {
	cfg, _ := kvtest.Config("tiny")
	place := LayerMap{0: "127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		c    SenderConfig
	}{
		{"no session", SenderConfig{Secret: testSecret, Placement: place, Deadline: time.Now().Add(time.Second)}},
		{"short secret", SenderConfig{Session: "x", Secret: []byte("x"), Placement: place, Deadline: time.Now().Add(time.Second)}},
		{"no placement", SenderConfig{Session: "x", Secret: testSecret, Deadline: time.Now().Add(time.Second)}},
		{"no deadline", SenderConfig{Session: "x", Secret: testSecret, Placement: place}},
		{"no endpoints", SenderConfig{Session: "x", Secret: testSecret, Placement: LayerMap{}, Deadline: time.Now().Add(time.Second)}},
	} {
		if _, err := NewSender(tc.c); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	s := newSender(t, &TCP{}, "x", place, nil)
	defer s.Abort(nil)
	ls := kvtest.RandomSeq(cfg, []int{0}, 1, model.BF16, 1).Layers[0]
	bad := ls.Clone()
	bad.Parts[0].Data = bad.Parts[0].Data[:10]
	if err := s.PutLayer(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("short data: %v", err)
	}
	other := ls.Clone()
	other.Layer = 1
	if err := s.PutLayer(context.Background(), other); err == nil || !strings.Contains(err.Error(), "no owner for layer 1") {
		t.Errorf("unplaced layer: %v", err)
	}
	if err := s.PutLayer(context.Background(), ls); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLayer(context.Background(), ls.Clone()); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate layer: %v", err)
	}
}
