package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/syncbuf"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// childEnv makes the test binary run as a prefill-worker process: the
// tests re-execute themselves instead of building the binary.
const childEnv = "TANDEM_PREFILL_WORKER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "prefill-worker: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child is a prefill-worker process.
type child struct {
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	done chan struct{}
	err  error // the exit, once done is closed
}

func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1", "TANDEM_PREFILL_WORKER_MEMORY_LIMIT=false")
	c := &child{cmd: cmd, log: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("prefill-worker log:\n%s", c.log.String())
		}
	})
	return c
}

// metricsURL waits for the process to log where it serves /metrics.
func (c *child) metricsURL(t *testing.T) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		for _, line := range strings.Split(c.log.String(), "\n") {
			var l struct {
				Msg, URL string
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "metrics and health" {
				return strings.TrimSuffix(l.URL, "/metrics")
			}
		}
		select {
		case <-c.done:
			t.Fatalf("the worker exited: %v", c.err)
		case <-deadline:
			t.Fatal("the worker logged no metrics address in 60s")
		case <-time.After(20 * time.Millisecond): // polling its log for the line
		}
	}
}

// get fetches base+path and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// waitReadyz polls /readyz until its status is want (and, for a 503, its
// text has contains).
func (c *child) waitReadyz(t *testing.T, base string, want int, contains string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		code, body := get(t, base+"/readyz")
		if code == want && strings.Contains(body, contains) {
			return
		}
		select {
		case <-c.done:
			t.Fatalf("the worker exited: %v", c.err)
		case <-deadline:
			t.Fatalf("/readyz: %d %q, want %d with %q", code, body, want, contains)
		case <-time.After(20 * time.Millisecond): // polling the endpoint
		}
	}
}

// TestShutdownAfterNATSDies kills the NATS server under a registered
// prefill worker, then sends the worker SIGTERM: it exits at once instead
// of waiting out its shutdown grace on a deregistration nobody can answer
// (it hung ~30 s there), within its graces as a bound, awaited on its exit.
func TestShutdownAfterNATSDies(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	srv := natstest.StartProcess(t, natstest.Config{})
	const drainGrace, shutdownGrace = 2 * time.Second, 5 * time.Second
	w := startChild(t, "--model", dir, "--memory-budget", "128MiB", "--nats-url", srv.URL, "--worker-id", "prefill-shutdown",
		"--registry-ttl", "2s", "--log-format", "json", "--metrics-listen", "127.0.0.1:0",
		"--drain-grace", drainGrace.String(), "--shutdown-grace", shutdownGrace.String())
	base := w.metricsURL(t)
	if code, body := get(t, base+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	w.waitReadyz(t, base, http.StatusOK, "ready")

	srv.Kill()
	// The worker has seen the loss: it is no longer ready, and says why.
	w.waitReadyz(t, base, http.StatusServiceUnavailable, "nats: NATS connection")

	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
	case <-time.After(drainGrace + shutdownGrace):
		t.Fatalf("the worker did not exit within its graces (%v + %v) after SIGTERM with NATS gone", drainGrace, shutdownGrace)
	}
	if w.err != nil {
		t.Fatalf("exit: %v", w.err)
	}
	// It left at once: the deregistration was skipped for want of a
	// connection, not cut short by the grace.
	log := w.log.String()
	if !strings.Contains(log, "not connected") || strings.Contains(log, "deadline exceeded") {
		t.Fatalf("the worker did not skip its deregistration for want of a connection:\n%s", log)
	}
}
