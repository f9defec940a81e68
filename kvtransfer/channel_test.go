package kvtransfer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
)

type actHeader struct {
	Seq   uint64 `msgpack:"seq"`
	Layer int    `msgpack:"layer"`
	Shape []int  `msgpack:"shape"`
}

func channelPair(t *testing.T, tr Transport, srv *Server, id string) (dialed, accepted *Channel) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := make(chan *Channel, 1)
	errc := make(chan error, 1)
	go func() {
		ch, err := srv.AcceptChannel(ctx, id, testSecret)
		errc <- err
		got <- ch
	}()
	// Dial once the accept is registered (a dial before it is refused as
	// an unknown session).
	testkit.WaitFor(testctx.Context(t), t, "the accept registered", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.channels[id] != nil
	})
	d, err := DialChannel(ctx, ChannelConfig{Transport: tr, Addr: srv.Addr(), ID: id, Secret: testSecret, Timeouts: fast})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	a := <-got
	t.Cleanup(func() { d.Close(); a.Close() })
	return d, a
}

func TestChannelBothWays(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	d, a := channelPair(t, r.client, r.servers[0], "mesh/rank0-rank1")
	ctx := context.Background()
	act := bytes.Repeat([]byte{1, 2, 3, 4, 5}, 300<<10/5) // a token's hidden state + block stack
	for i := 0; i < 3; i++ {
		if err := d.Send(ctx, &actHeader{Seq: uint64(i), Layer: 12, Shape: []int{9, 7168}}, act); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 0, len(act))
	for i := 0; i < 3; i++ {
		var h actHeader
		got, err := a.Recv(ctx, &h, buf)
		if err != nil {
			t.Fatal(err)
		}
		if h.Seq != uint64(i) || h.Layer != 12 || len(h.Shape) != 2 || !bytes.Equal(got, act) || &got[0] != &buf[:1][0] {
			t.Fatalf("message %d: header %+v, %d bytes (buffer reused: %v)", i, h, len(got), &got[0] == &buf[:1][0])
		}
	}
	// The other way, header only and payload only.
	if err := a.Send(ctx, &actHeader{Seq: 99}, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Send(ctx, nil, []byte("tok")); err != nil {
		t.Fatal(err)
	}
	var h actHeader
	if p, err := d.Recv(ctx, &h, nil); err != nil || h.Seq != 99 || len(p) != 0 {
		t.Fatalf("header-only: %+v %q %v", h, p, err)
	}
	if p, err := d.Recv(ctx, nil, nil); err != nil || string(p) != "tok" {
		t.Fatalf("payload-only: %q %v", p, err)
	}
	a.Close()
	if _, err := d.Recv(ctx, nil, nil); !errors.Is(err, io.EOF) {
		t.Fatalf("after the peer closed: %v", err)
	}
}

func TestChannelDeadlineBreaksIt(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	d, _ := channelPair(t, r.client, r.servers[0], "dl")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := d.Recv(ctx, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if err := d.Send(context.Background(), nil, []byte("x")); err == nil {
		t.Fatal("a channel whose Recv was interrupted still sends")
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	_, a := channelPair(t, r.client, r.servers[0], "cancel")
	if _, err := a.Recv(ctx2, nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Recv: %v", err)
	}
}

func TestChannelAuth(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		ch, err := r.servers[0].AcceptChannel(ctx, "guarded", testSecret)
		if ch != nil {
			ch.Close()
		}
		accepted <- err
	}()
	testkit.WaitFor(testctx.Context(t), t, "the accept registered", func() bool {
		r.servers[0].mu.Lock()
		defer r.servers[0].mu.Unlock()
		return r.servers[0].channels["guarded"] != nil
	})
	_, err := DialChannel(ctx, ChannelConfig{Transport: r.client, Addr: r.servers[0].Addr(), ID: "guarded", Secret: []byte("a-wrong-secret-of-enough-bytes")})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong secret: %v", err)
	}
	// The accept is still pending for the right dialer.
	ch, err := DialChannel(ctx, ChannelConfig{Transport: r.client, Addr: r.servers[0].Addr(), ID: "guarded", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	// Accepted once: the id is gone.
	if _, err := DialChannel(ctx, ChannelConfig{Transport: r.client, Addr: r.servers[0].Addr(), ID: "guarded", Secret: testSecret}); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("second dial: %v", err)
	}
	actx, acancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer acancel()
	if _, err := r.servers[0].AcceptChannel(actx, "nobody-dials", testSecret); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("accept without dialer: %v", err)
	}
}
