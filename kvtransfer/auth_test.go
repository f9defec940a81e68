package kvtransfer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

// rawClient speaks the protocol frame by frame, to do what a correct sender
// never does.
type rawClient struct {
	t *testing.T
	c Conn
}

func dialRaw(t *testing.T, tr Transport, addr string) *rawClient {
	t.Helper()
	c, err := tr.Dial(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return &rawClient{t: t, c: c}
}

func (rc *rawClient) write(h *header, payload []byte) {
	rc.t.Helper()
	b, err := encodeHeader(h)
	if err != nil {
		rc.t.Fatal(err)
	}
	if err := rc.c.WriteFrame(b, payload); err != nil {
		rc.t.Fatal(err)
	}
}

// read returns the next control frame; an ERROR comes back as an error.
func (rc *rawClient) read() (*header, error) {
	h := new(header)
	return h, readControl(rc.c, h)
}

// challenge reads the server's CHALLENGE and returns its nonce.
func (rc *rawClient) challenge() []byte {
	rc.t.Helper()
	h, err := rc.read()
	if err != nil || h.Type != frameChallenge {
		rc.t.Fatalf("expected CHALLENGE, got %v %v", h.Type, err)
	}
	return h.Nonce
}

// hello builds a HELLO proving secret for the server nonce snonce.
func hello(sid string, secret, snonce []byte) *header {
	cn := newNonce()
	return &header{Type: frameHello, Version: ProtocolVersion, Kind: kindTransfer, Session: sid, Nonce: cn,
		Proof: proof(secret, roleClient, kindTransfer, sid, snonce, cn)}
}

// login authenticates as a sender of sid and returns the WELCOME.
func (rc *rawClient) login(sid string) *header {
	rc.t.Helper()
	rc.write(hello(sid, testSecret, rc.challenge()), nil)
	w, err := rc.read()
	if err != nil || w.Type != frameWelcome {
		rc.t.Fatalf("expected WELCOME, got %v %v", w.Type, err)
	}
	return w
}

func TestWrongSecretRefusedBeforeAllocation(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	ins := r.expect("auth", 10, model.BF16, 5*time.Second)
	s, err := NewSender(SenderConfig{Transport: r.client, Session: "auth", Secret: []byte("not-the-session-secret!"), Placement: r.place,
		Deadline: time.Now().Add(5 * time.Second), Timeouts: fast})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Close(context.Background(), 10)
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong secret: got %v, want ErrAuth", err)
	}
	st := r.servers[0].Stats()
	if st.AuthFailures == 0 || st.HeldBytes != 0 {
		t.Errorf("after a refused proof: %+v (want auth failures and nothing allocated)", st)
	}
	if _, p := ins[0].Progress(); p == 0 {
		t.Error("no bytes expected?")
	}
	ins[0].Cancel()
	r.checkFreed()
}

// TestReplayRefused records a valid HELLO and replays it on a new
// connection: the server's fresh nonce makes the recorded proof worthless.
func TestReplayRefused(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	ins := r.expect("replay", 10, model.BF16, 5*time.Second)
	defer ins[0].Cancel()
	addr := r.servers[0].Addr()

	first := dialRaw(t, r.client, addr)
	recorded := hello("replay", testSecret, first.challenge())
	first.write(recorded, nil)
	if w, err := first.read(); err != nil || w.Type != frameWelcome {
		t.Fatalf("genuine HELLO: %v %v", w.Type, err)
	}
	first.c.Close()
	held := r.servers[0].Stats().HeldBytes

	second := dialRaw(t, r.client, addr)
	second.challenge()
	second.write(recorded, nil)
	_, err := second.read()
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("replayed HELLO: got %v, want an auth refusal", err)
	}
	if got := r.servers[0].Stats(); got.AuthFailures != 1 || got.HeldBytes != held {
		t.Errorf("after the replay: %+v", got)
	}
}

func TestUnknownSessionRefused(t *testing.T) {
	r := newRig(t, "tiny", 1, ServerConfig{})
	s, err := NewSender(SenderConfig{Transport: r.client, Session: "nobody-expects-this", Secret: testSecret, Placement: r.place,
		Deadline: time.Now().Add(5 * time.Second), Timeouts: fast})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(context.Background(), 0); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("got %v, want ErrUnknownSession", err)
	}
}

// TestImpostorServerRefused: a server that does not know the secret cannot
// produce the WELCOME proof, and the sender sends it nothing.
func TestImpostorServerRefused(t *testing.T) {
	onTCP(t) // a raw TCP impostor
	ln, err := (&TCP{}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	next := make(chan frameType, 1)
	go func() {
		defer close(next)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		b, _ := encodeHeader(&header{Type: frameChallenge, Version: ProtocolVersion, Nonce: newNonce()})
		c.WriteFrame(b, nil)
		var h header
		if readControl(c, &h) != nil {
			return
		}
		b, _ = encodeHeader(&header{Type: frameWelcome, Version: ProtocolVersion, Chunk: 1024, Window: 4, Proof: newNonce()})
		c.WriteFrame(b, nil)
		// Whatever comes next must not be state.
		c.ReadFrame(func(hb []byte, n int) ([]byte, error) {
			decodeHeader(hb, &h)
			next <- h.Type
			return nil, nil
		})
	}()
	cfg, err := kvtest.Config("tiny")
	if err != nil {
		t.Fatal(err)
	}
	place := LayerMap{}
	for L := 0; L < cfg.NumLayers; L++ {
		place[L] = ln.Addr()
	}
	s, err := NewSender(SenderConfig{Transport: &TCP{}, Session: "impostor", Secret: testSecret, Placement: place, Conns: 1,
		Deadline: time.Now().Add(5 * time.Second), Timeouts: fast})
	if err != nil {
		t.Fatal(err)
	}
	// The refusal surfaces at PutLayer when the handshake has already failed
	// by then, else at Close: either is the promise.
	err = s.PutLayer(context.Background(), cfg.NewLayerState(0, model.StateOptions{}))
	if cerr := s.Close(context.Background(), 0); err == nil {
		err = cerr
	}
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "could not prove") {
		t.Fatalf("impostor accepted: %v", err)
	}
	if ft, ok := <-next; ok && ft == frameData {
		t.Fatal("the sender sent state to an impostor")
	}
}
