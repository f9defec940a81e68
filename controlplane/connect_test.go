package controlplane

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRetryConnectThroughGarbledHandshakes: a server that answers the
// handshake's PING with its own PING (as a swamped nats-server does once
// its first-ping timer beats its reply) fails a plain Connect after
// handshakeTries tries, and is tried again under RetryConnect until the
// context ends.
func TestRetryConnectThroughGarbledHandshakes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				_, _ = c.Write([]byte(`INFO {"server_id":"fake","version":"2.11.0","max_payload":1048576,"proto":1}` + "\r\n"))
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "PING") {
						_, _ = c.Write([]byte("PING\r\n"))
						return
					}
				}
			}()
		}
	}()
	url := "nats://" + ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Connect(ctx, Options{URL: url, ReconnectWait: 10 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), "expected 'PONG'") {
		t.Fatalf("plain connect: %v, want the garbled handshake", err)
	}
	n := accepted.Load()
	if n != handshakeTries {
		t.Fatalf("plain connect tried %d times, want %d", n, handshakeTries)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := Connect(rctx, Options{URL: url, RetryConnect: true, ReconnectWait: 10 * time.Millisecond})
		done <- err
	}()
	for accepted.Load() < n+3 {
		select {
		case err := <-done:
			t.Fatalf("retrying connect gave up after %d tries: %v", accepted.Load()-n, err)
		case <-ctx.Done():
			t.Fatal("no retries")
		case <-time.After(10 * time.Millisecond): // polling the fake server's count
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("retrying connect ended with %v, want its context's end", err)
	}
}
