package kvtransfer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/model"
)

func tcpPair(t *testing.T, tr *TCP) (Conn, Conn) {
	t.Helper()
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := tr.Dial(context.Background(), ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	for _, x := range []Conn{c, s} {
		x.SetReadDeadline(time.Now().Add(5 * time.Second))
		x.SetWriteDeadline(time.Now().Add(5 * time.Second))
	}
	return c, s
}

func TestTCPFrames(t *testing.T) {
	c, s := tcpPair(t, &TCP{})
	payload := bytes.Repeat([]byte("kv"), 100000)
	go func() {
		c.WriteFrame([]byte("hdr1"), payload)
		c.WriteFrame([]byte("hdr2"), nil)
		c.WriteFrame([]byte("hdr3"), []byte("skipped"))
		c.WriteFrame([]byte("hdr4"), []byte("x"))
	}()
	dst := make([]byte, len(payload))
	var hdrs []string
	for i := 0; i < 4; i++ {
		err := s.ReadFrame(func(h []byte, n int) ([]byte, error) {
			hdrs = append(hdrs, string(h))
			switch i {
			case 0:
				return dst[:n], nil
			case 3:
				return nil, errors.New("refused")
			}
			return nil, nil
		})
		if i == 3 {
			if err == nil || err.Error() != "refused" {
				t.Fatalf("place error not returned: %v", err)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(dst, payload) || len(hdrs) != 4 || hdrs[2] != "hdr3" {
		t.Fatalf("headers %q, payload equal %v", hdrs, bytes.Equal(dst, payload))
	}
}

// TestTCPFrameIntegrity flips every bit of a frame's prefix and header in
// turn: each corruption is caught before the header reaches the session.
func TestTCPFrameIntegrity(t *testing.T) {
	hb, err := encodeHeader(&header{Type: frameData, Seq: 7, Layer: 3, Part: model.PartLatent, Off: 4096, Len: 16, CRC: 1})
	if err != nil {
		t.Fatal(err)
	}
	frame := append(appendFrameHead(nil, hb, 16), make([]byte, 16)...)
	for bit := 0; bit < (tcpPrefix+len(hb))*8; bit++ {
		b := bytes.Clone(frame)
		b[bit/8] ^= 1 << (bit % 8)
		x, y := net.Pipe()
		conn := newTCPConn(y, 1<<20)
		go func() { x.Write(b); x.Close() }()
		called := false
		err := conn.ReadFrame(func(h []byte, n int) ([]byte, error) { called = true; return nil, nil })
		if err == nil || called {
			t.Fatalf("bit %d flipped: err %v, header passed to the session: %v", bit, err, called)
		}
		y.Close()
	}
	// Intact, it passes.
	x, y := net.Pipe()
	defer y.Close()
	go func() { x.Write(frame); x.Close() }()
	if err := newTCPConn(y, 1<<20).ReadFrame(func(h []byte, n int) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
}

func TestTCPLimits(t *testing.T) {
	c, s := tcpPair(t, &TCP{MaxPayload: 1000})
	if err := c.WriteFrame(nil, nil); err == nil {
		t.Error("empty header written")
	}
	if err := c.WriteFrame(make([]byte, MaxHeader+1), nil); err == nil {
		t.Error("oversized header written")
	}
	go c.WriteFrame([]byte("h"), make([]byte, 1001))
	if err := s.ReadFrame(func([]byte, int) ([]byte, error) { t.Error("place called"); return nil, nil }); !errors.Is(err, errFrame) {
		t.Fatalf("payload over the limit: %v", err)
	}
}
