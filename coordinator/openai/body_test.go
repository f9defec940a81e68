package openai_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/internal/bytebudget"
)

// stalled is a raw connection that sent a request's headers and part of its
// body, then stopped.
type stalled struct {
	conn net.Conn
	resp chan string // the status line the server answered, once
}

// stall opens a connection to addr, sends a chat completion's headers
// declaring a body of declared bytes and the first sent bytes of it, and
// waits in the background for the server's status line.
func stall(t *testing.T, addr string, declared, sent int) *stalled {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", declared)
	body := "{" + strings.Repeat(" ", sent-1)
	s := &stalled{conn: conn, resp: make(chan string, 1)}
	go func() {
		// A refused body is not read to its end: the write may fail.
		go func() { _, _ = conn.Write([]byte(head + body)) }()
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			line = "read: " + err.Error()
		}
		s.resp <- strings.TrimSpace(line)
	}()
	return s
}

// waitHeld waits until the budget holds at least n bytes: the server has
// read that much of the bodies in flight.
func waitHeld(t *testing.T, b *bytebudget.Budget, n int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); b.Held() < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the budget holds %d bytes, want at least %d", b.Held(), n)
		}
	}
}

// TestSlowBodiesHoldNoSlot is the slow-body attack: with 4 request slots,
// 8 connections send a request's headers and a few bytes of its body, then
// stall. The bodies are read before a slot is taken, so an ordinary request
// sent meanwhile is answered 200 (not 429), and each stalled request is
// answered 408 once its body timeout has passed, giving its bytes back.
func TestSlowBodiesHoldNoSlot(t *testing.T) {
	budget := bytebudget.New(64 << 20)
	const timeout = 15 * time.Second
	d := startDeployment(t, func(c *openai.Config) {
		c.MaxConcurrentPerKey = 4
		c.BodyTimeout = timeout
		c.Budget = budget
	})
	const declared, sent = 2000, 10
	var slow []*stalled
	for range 8 {
		slow = append(slow, stall(t, d.addr, declared, sent))
	}
	// Every stalled body is being read: each holds its first buffer.
	waitHeld(t, budget, 8*(declared+1))
	resp := post(t, d.url+"/v1/chat/completions", "", chatBody("Say hi.", false, 4))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("an ordinary request beside 8 stalled bodies: %d, want 200", resp.StatusCode)
	}
	// Answered beside them, not after them: none is answered yet.
	for i, s := range slow {
		select {
		case line := <-s.resp:
			t.Fatalf("stalled request %d was answered %q before the ordinary one was (make the body timeout longer)", i, line)
		default:
		}
	}
	for i, s := range slow {
		select {
		case line := <-s.resp:
			if !strings.Contains(line, " 408 ") {
				t.Fatalf("stalled request %d: %q, want 408", i, line)
			}
		case <-time.After(timeout + 20*time.Second):
			t.Fatalf("stalled request %d was not answered", i)
		}
	}
	if budget.Held() != 0 {
		t.Fatalf("the budget holds %d bytes after every request ended", budget.Held())
	}
}

// TestBodiesShareTheSubmissionBudget is the large-body attack: the front
// door and the coordinator hold their bytes to one budget (as `coordinator
// serve` has them). 8 connections each declare a 400 KiB body and send
// 300 KiB of it; the server holds no more than the 1 MiB budget of them
// (the rest are answered 503 at once, not read), and while they hold it a
// large submission on NATS is refused unavailable, a small one still
// answered. Once the stalled bodies time out (408), a large submission is
// taken again.
func TestBodiesShareTheSubmissionBudget(t *testing.T) {
	budget := bytebudget.New(1 << 20)
	const timeout = 4 * time.Second
	d := startDeploymentWith(t, func(o *cluster.Options) { o.Coordinator.Budget = budget }, func(c *openai.Config) {
		c.BodyTimeout = timeout
		c.Budget = budget
	})
	const declared, sent = 400 << 10, 300 << 10
	var slow []*stalled
	for range 8 {
		slow = append(slow, stall(t, d.addr, declared, sent))
	}
	// At most two 400 KiB buffers fit in 1 MiB: at least six of the eight
	// are refused while their bodies are read, well before the timeout.
	answers := make(chan int, len(slow))
	lines := make([]string, len(slow))
	for i, s := range slow {
		go func() { lines[i] = <-s.resp; answers <- i }()
	}
	refused, answered := 0, make([]bool, len(slow))
	for deadline := time.After(timeout / 2); refused < len(slow); {
		select {
		case i := <-answers:
			if !strings.Contains(lines[i], " 503 ") {
				t.Fatalf("body %d: %q, want 503 or nothing yet", i, lines[i])
			}
			answered[i] = true
			refused++
			continue
		case <-deadline:
		}
		break
	}
	var pending []int
	for i := range slow {
		if !answered[i] {
			pending = append(pending, i)
		}
	}
	t.Logf("%d bodies refused while read, %d pending", refused, len(pending))
	if refused < 6 {
		t.Fatalf("%d of 8 bodies refused, want at least 6 (a 1 MiB budget holds two 400 KiB bodies)", refused)
	}
	if held := budget.Held(); held > budget.Limit() {
		t.Fatalf("the budget holds %d bytes, over its %d", held, budget.Limit())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A submission over 64 KiB (msgpack: 5 bytes a token id of 70000)
	// that does not fit beside the pending bodies.
	large := &cp.SubmitRequest{TokenIDs: slices.Repeat([]int32{70000}, 20000), Sampling: cp.Sampling{MaxTokens: 1}}
	small := &cp.SubmitRequest{TokenIDs: []int32{1, 2, 3}, Sampling: cp.Sampling{MaxTokens: 1}}
	if len(pending) > 0 {
		waitHeld(t, budget, int64(len(pending))*(declared+1))
		free := budget.Limit() - budget.Held()
		large.TokenIDs = slices.Repeat([]int32{70000}, int(free/5)+1000)
		if _, err := cp.Submit(ctx, d.nc, large); err == nil || !strings.Contains(err.Error(), string(cp.CodeUnavailable)) {
			t.Fatalf("a large submission while request bodies fill the budget: %v, want unavailable", err)
		}
	}
	if _, err := cp.Submit(ctx, d.nc, small); err != nil {
		t.Fatalf("a small submission while the budget is full: %v", err)
	}
	for range pending {
		select {
		case i := <-answers:
			if !strings.Contains(lines[i], " 408 ") {
				t.Fatalf("pending body %d: %q, want 408", i, lines[i])
			}
		case <-time.After(timeout + 20*time.Second):
			t.Fatal("a pending body was not answered")
		}
	}
	for deadline := time.Now().Add(20 * time.Second); budget.Held() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the budget still holds %d bytes", budget.Held())
		}
	}
	if _, err := cp.Submit(ctx, d.nc, large); err != nil && strings.Contains(err.Error(), string(cp.CodeUnavailable)) {
		t.Fatalf("a large submission once the bodies are gone: %v", err)
	}
}
