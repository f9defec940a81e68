// Package natstest runs the pinned NATS tools for tests: real nats-server
// processes and the nats CLI (scripts/install-nats.sh puts both in
// <repo>/bin; tests skip, saying how to install them, when they are absent).
package natstest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// Tool finds a pinned NATS tool in <repo>/bin, then on PATH, or skips the
// test saying how to install it.
func Tool(tb testing.TB, name string) string {
	tb.Helper()
	if dir, err := os.Getwd(); err == nil {
		for d := dir; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				p := filepath.Join(d, "bin", name)
				if _, err := os.Stat(p); err == nil {
					return p
				}
				break
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	tb.Skipf("%s not found in <repo>/bin or on PATH: run scripts/install-nats.sh to install the pinned NATS tools", name)
	return ""
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Config is a nats-server configuration for Start.
type Config struct {
	// Extra is appended to the generated configuration (which listens on a
	// random loopback port with JetStream in a temporary directory and an
	// 8 MiB max payload): authorization or tls blocks.
	Extra string
	// Scheme of the returned URL: "nats" (default) or "tls".
	Scheme string
	// Ready reports whether the server at url serves what the test needs;
	// Start retries it for up to 20 s. Nil means JetStream answers a plain
	// (unauthenticated, plain-text) connection.
	Ready func(url string) error
}

// Server runs a plain nats-server process with JetStream and returns its
// URL; the process is killed when the test ends.
func Server(tb testing.TB) string {
	tb.Helper()
	return Start(tb, Config{})
}

// Start runs a nats-server process with the given configuration and
// returns its URL once Ready succeeds; the process is killed when the test
// ends.
func Start(tb testing.TB, cfg Config) string {
	tb.Helper()
	return StartProcess(tb, cfg).URL
}

// Process is a running nats-server.
type Process struct {
	URL    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Kill stops the server as a crash would (SIGKILL) and waits for it.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Cluster runs n nats-server processes clustered on loopback (JetStream
// on each) with extra appended to each configuration (an authorization
// block), and returns them once JetStream answers on every one to a
// connection made with opts.
func Cluster(tb testing.TB, n int, extra string, opts ...nats.Option) []*Process {
	tb.Helper()
	var routes []string
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ls = append(ls, l)
		routes = append(routes, "nats-route://"+l.Addr().String())
	}
	for _, l := range ls {
		_ = l.Close()
	}
	opts = append([]nats.Option{nats.Timeout(2 * time.Second)}, opts...)
	connects := func(url string) error {
		nc, err := nats.Connect(url, opts...)
		if err == nil {
			nc.Close()
		}
		return err
	}
	var ps []*Process
	for i := range n {
		conf := fmt.Sprintf("server_name: n%d\ncluster {\n  name: tandem-test\n  listen: %q\n  routes: [%s]\n}\n%s",
			i, strings.TrimPrefix(routes[i], "nats-route://"), strings.Join(routes, ", "), extra)
		ps = append(ps, StartProcess(tb, Config{Extra: conf, Ready: connects}))
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, p := range ps {
		for {
			err := jetStreamReady(p.URL, opts...)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("clustered nats-server at %s: JetStream not ready: %v", p.URL, err)
			}
			time.Sleep(100 * time.Millisecond) // polling a condition with a deadline
		}
	}
	return ps
}

// StartProcess is Start, returning the process so that a test can kill it.
func StartProcess(tb testing.TB, cfg Config) *Process {
	tb.Helper()
	bin := Tool(tb, "nats-server")
	dir := tb.TempDir()
	conf := fmt.Sprintf("listen: \"127.0.0.1:-1\"\nmax_payload: %d\njetstream {\n  store_dir: %q\n}\n%s", 8<<20, filepath.Join(dir, "js"), cfg.Extra)
	confPath := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		tb.Fatal(err)
	}
	portsDir := filepath.Join(dir, "ports")
	if err := os.Mkdir(portsDir, 0o700); err != nil {
		tb.Fatal(err)
	}
	var log strings.Builder
	var mu sync.Mutex
	cmd := exec.Command(bin, "-c", confPath, "--ports_file_dir", portsDir)
	cmd.Stdout, cmd.Stderr = lockedWriter{&mu, &log}, lockedWriter{&mu, &log}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	proc := &Process{cmd: cmd, exited: exited}
	tb.Cleanup(proc.Kill)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		tb.Fatalf(format+"\nnats-server log:\n%s", append(args, log.String())...)
	}
	scheme := cfg.Scheme
	if scheme == "" {
		scheme = "nats"
	}
	ready := cfg.Ready
	if ready == nil {
		ready = func(url string) error { return jetStreamReady(url) }
	}
	portsFile := filepath.Join(portsDir, fmt.Sprintf("%s_%d.ports", filepath.Base(bin), cmd.Process.Pid))
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(portsFile); err == nil {
			var ports struct{ Nats []string }
			if json.Unmarshal(b, &ports) == nil && len(ports.Nats) > 0 {
				u := ports.Nats[0]
				if i := strings.Index(u, "://"); i >= 0 {
					u = u[i+3:]
				}
				url := scheme + "://" + u
				for {
					err := ready(url)
					if err == nil {
						proc.URL = url
						return proc
					}
					if time.Now().After(deadline) {
						fail("nats-server at %s not ready: %v", url, err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
		select {
		case <-exited:
			fail("nats-server exited before listening")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			fail("nats-server wrote no ports file in 20s")
		}
	}
}

// jetStreamReady checks that JetStream answers a plain connection (or one
// made with opts).
func jetStreamReady(url string, opts ...nats.Option) error {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(2 * time.Second)}, opts...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	_, err = nc.Request("$JS.API.INFO", nil, 2*time.Second)
	return err
}

// CLI runs the nats CLI against url with args and returns its output.
func CLI(ctx context.Context, tb testing.TB, url string, args ...string) (string, error) {
	tb.Helper()
	bin := Tool(tb, "nats")
	cmd := exec.CommandContext(ctx, bin, append([]string{"--server", url, "--no-context"}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+tb.TempDir()) // no user contexts
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// MalformedAnswered sends bytes that are no message at all to a request
// subject and checks that the server behind it answers with a bad_request
// error reply (msgpack, with "code" and "error"), rather than leaving the
// sender to time out.
func MalformedAnswered(ctx context.Context, nc *nats.Conn, subject string) error {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(rctx, subject, []byte{0xc1, 0xff, 0x00})
	if err != nil {
		return fmt.Errorf("malformed request on %s: no answer: %w", subject, err)
	}
	var rep struct {
		Code  string `msgpack:"code"`
		Error string `msgpack:"error"`
	}
	if err := msgpack.Unmarshal(m.Data, &rep); err != nil {
		return fmt.Errorf("malformed request on %s: the answer does not decode: %w", subject, err)
	}
	if rep.Code != "bad_request" || rep.Error == "" {
		return fmt.Errorf("malformed request on %s: answered %+v, want a bad_request error", subject, rep)
	}
	return nil
}
