package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestStandaloneAPIWithoutWorkers: `coordinator api` alone, logged in as a
// client (which may not read the worker registry), in front of a
// coordinator process with no workers: a chat completion is answered 503
// at once (not after the coordinator's 60 s placement wait) with an
// OpenAI-shaped error saying why, and /health says the same.
func TestStandaloneAPIWithoutWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and an API process: not in -short")
	}
	dir := testmodel.Dir(t, "demo", 1, 2)
	port := freePort(t)
	creds, _ := credentials(t)
	startCoordinator(t, "--model", dir, "--embedded-port", fmt.Sprint(port), "--embedded-data-dir", t.TempDir(),
		"--embedded-credentials-dir", creds)
	api := startChild(t, "OpenAI-compatible API", "api", "--model", dir, "--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", port),
		"--nats-credentials", cp.IdentityFile(creds, cp.PrincipalClient), "--http-listen", "127.0.0.1:0", "--log-format", "json")
	var base string
	for _, line := range strings.Split(api.log.String(), "\n") {
		var m struct{ Msg, URL string }
		if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "OpenAI-compatible API" {
			base = m.URL
		}
	}
	if base == "" {
		t.Fatalf("no API address in the log:\n%s", api.log.String())
	}

	start := time.Now()
	body := fmt.Sprintf(`{"model": %q, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true}`, filepath.Base(dir))
	resp, err := http.Post(base+"/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(b, &e) != nil {
		t.Fatalf("chat completion without workers: %d %s, want a 503 error object", resp.StatusCode, b)
	}
	if e.Error.Type != "service_unavailable" || e.Error.Code == nil || *e.Error.Code != "no_workers" ||
		!strings.Contains(e.Error.Message, "no decode group of model") {
		t.Fatalf("error %s, want service_unavailable / no_workers saying no decode group is up", b)
	}
	// Far below the coordinator's placement wait (60 s): the answer came
	// from the availability request, not a job that timed out.
	if took > 20*time.Second {
		t.Fatalf("503 after %v", took)
	}
	t.Logf("503 in %v: %s", took.Round(time.Millisecond), e.Error.Message)

	resp, err = http.Get(strings.TrimSuffix(base, "/v1") + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var h struct {
		Status  string `json:"status"`
		Workers *int   `json:"decode_workers"`
		Reason  string `json:"reason"`
	}
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(b, &h) != nil || h.Workers == nil || *h.Workers != 0 ||
		!strings.Contains(h.Reason, "no decode group") {
		t.Fatalf("/health without workers: %d %s", resp.StatusCode, b)
	}
}

// TestServeAPISlowBodiesHoldNoSlot is the slow-body attack on `coordinator
// serve` with its API, as a process: with 4 request slots, 8 connections
// send a chat completion's headers and one byte of its body, then stall.
// An ordinary request sent meanwhile is not refused 429 (the slots are
// taken only once a body is in): with no workers it gets its 503 at once.
// The stalled requests are answered 408 at the body timeout.
func TestServeAPISlowBodiesHoldNoSlot(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator process: not in -short")
	}
	dir := testmodel.Dir(t, "demo", 1, 2)
	creds, _ := credentials(t)
	co := startCoordinator(t, "--model", dir, "--embedded-port", fmt.Sprint(freePort(t)), "--embedded-data-dir", t.TempDir(),
		"--embedded-credentials-dir", creds, "--http-listen", "127.0.0.1:0", "--http-max-concurrent-per-key", "4",
		"--http-body-timeout", "10s")
	var base string
	for deadline := time.Now().Add(30 * time.Second); base == ""; time.Sleep(20 * time.Millisecond) {
		for _, line := range strings.Split(co.log.String(), "\n") {
			var m struct{ Msg, URL string }
			if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "OpenAI-compatible API" {
				base = m.URL
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no API address in the log:\n%s", co.log.String())
		}
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/v1")
	answers := make(chan string, 8)
	for range 8 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
		go func() {
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				line = err.Error()
			}
			answers <- strings.TrimSpace(line)
		}()
	}
	body := fmt.Sprintf(`{"model": %q, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}`, filepath.Base(dir))
	// Until the stalled requests are answered, every ordinary one is
	// answered beside them, none refused for want of a slot.
	for range 3 {
		resp, err := http.Post(base+"/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "no_workers") {
			t.Fatalf("an ordinary request beside 8 stalled bodies: %d %s, want 503 no_workers (a 429 means the stalled bodies hold the slots)", resp.StatusCode, b)
		}
	}
	select {
	case line := <-answers:
		t.Fatalf("a stalled request was answered %q before the ordinary ones were", line)
	default:
	}
	for range 8 {
		select {
		case line := <-answers:
			if !strings.Contains(line, " 408 ") {
				t.Fatalf("stalled request: %q, want 408", line)
			}
		case <-time.After(40 * time.Second):
			t.Fatal("a stalled request was not answered")
		}
	}
}

// TestServeAPILargeBodiesStayBounded is the large-body attack on
// `coordinator serve` with its API, as a process: 32 clients send 15 MiB
// chat bodies at once. The bodies share the coordinator's in-flight byte
// budget (64 MiB), so each is refused (413 for its prompt, or 503 when
// the budget is full) while the process's peak memory stays a multiple of
// the budget, whatever the number of bodies.
func TestServeAPILargeBodiesStayBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator process: not in -short")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads the process's peak memory from /proc")
	}
	dir := testmodel.Dir(t, "demo", 1, 2)
	creds, _ := credentials(t)
	co := startCoordinator(t, "--model", dir, "--embedded-port", fmt.Sprint(freePort(t)), "--embedded-data-dir", t.TempDir(),
		"--embedded-credentials-dir", creds, "--http-listen", "127.0.0.1:0")
	var base string
	for _, line := range strings.Split(co.log.String(), "\n") {
		var m struct{ Msg, URL string }
		if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "OpenAI-compatible API" {
			base = m.URL
		}
	}
	if base == "" {
		t.Fatalf("no API address in the log:\n%s", co.log.String())
	}
	before := peakRSS(t, co.cmd.Process.Pid)
	body := []byte(fmt.Sprintf(`{"model": %q, "messages": [{"role": "user", "content": "%s"}]}`, filepath.Base(dir),
		strings.Repeat("tandem ", 15<<20/7)))
	codes := make(chan int, 32)
	for range 32 {
		go func() {
			resp, err := http.Post(base+"/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	seen := map[int]int{}
	for range 32 {
		seen[<-codes]++
	}
	peak := peakRSS(t, co.cmd.Process.Pid)
	t.Logf("answers %v; peak resident %d MiB (%d MiB before the bodies)", seen, peak>>20, before>>20)
	if seen[http.StatusRequestEntityTooLarge]+seen[http.StatusServiceUnavailable] != 32 {
		t.Errorf("answers %v, want every body refused 413 or 503", seen)
	}
	// The budget lets about four bodies in at once; each is held a few
	// times over while it is decoded and rendered (the body, its JSON
	// value, the text, the segments), and the heap runs up to twice its
	// live size before a collection: about 700 MiB here. Without the
	// budget the 32 bodies took 4.0 GB.
	if peak-before > 1<<30 {
		t.Errorf("peak resident memory grew by %d MiB under 32 large bodies", (peak-before)>>20)
	}
}

// peakRSS is the process's peak resident memory (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}
