package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/frontdoor"
	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/internal/syncbuf"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
)

// benchGroup names the measured groups.
const benchGroup = "bench"

// startInProcess starts a group of P x T ranks in this process, each rank
// with --threads threads (at least one), and serves rank 0's front door.
func (lb *layoutBench) startInProcess(ctx context.Context, P, T int) (*frontdoor.Client, func(), error) {
	opt, err := groupOptions(lb.mf, P*T, T)
	if err != nil {
		return nil, nil, err
	}
	opt.Group, opt.Threads, opt.MicroBatches = benchGroup, max(lb.mf.threads, 1), lb.micro
	opt.Draft.Off, opt.PrefixCache.Off = true, true
	opt.Secret = make([]byte, 32)
	_, _ = rand.Read(opt.Secret) // crypto/rand.Read never fails
	var trs []*rdma.Transport
	closeTransports := func() {
		for _, t := range trs {
			t.Close()
		}
	}
	if lb.transport == "rdma-fake" {
		fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
		for r := range P * T {
			t, err := rdma.New(rdma.Config{Provider: fab.Host(fmt.Sprintf("rank%d", r), benchGID)})
			if err != nil {
				closeTransports()
				return nil, nil, err
			}
			trs = append(trs, t)
		}
		opt.Transport = func(r int) kvtransfer.Transport { return kvtransfer.Shared{RDMA: trs[r]} }
	}
	g, err := group.Start(ctx, opt)
	if err != nil {
		closeTransports()
		return nil, nil, err
	}
	sctx, stopServing := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() {
		defer close(served)
		frontdoor.Serve(sctx, g.Server(0), opt.Group, opt.Secret, g.Head(), nil)
	}()
	stop := func() {
		stopServing()
		<-served
		g.Close()
		closeTransports()
	}
	head, err := frontdoor.Dial(ctx, g.Server(0).Addr(), opt.Group, opt.Secret, kvtransfer.Timeouts{})
	if err != nil {
		stop()
		return nil, nil, err
	}
	return head, func() { head.Close(); stop() }, nil
}

// rankProc is one decode-worker process and its output.
type rankProc struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan error
}

// startProcesses starts P x T decode-worker processes on loopback, rank r
// with GOMAXPROCS 1 and one compute thread, pinned to CPU r mod the CPUs
// (linux), and dials rank 0's front door once the ring is formed.
func (lb *layoutBench) startProcesses(ctx context.Context, P, T int) (*frontdoor.Client, func(), error) {
	eps, err := freeAddrs(P * T)
	if err != nil {
		return nil, nil, err
	}
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	secret := []byte(hex.EncodeToString(key)) // the group file's secret is its text
	dir, err := os.MkdirTemp("", "bench-decodegroup-")
	if err != nil {
		return nil, nil, err
	}
	file := filepath.Join(dir, "group.yaml")
	if err := os.WriteFile(file, groupFile(string(secret), T, eps), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	procs := make([]*rankProc, 0, P*T)
	stop := func() {
		stopRanks(procs)
		os.RemoveAll(dir)
	}
	for r := range P * T {
		p, err := lb.startRank(lb.worker, file, r)
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("rank %d: %w", r, err)
		}
		procs = append(procs, p)
	}
	head, err := dialFormed(ctx, eps[0], secret, procs)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return head, func() { head.Close(); stop() }, nil
}

// groupFile is the group's configuration file (decode-worker's format).
func groupFile(secret string, tensor int, eps []string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "group: %s\nsecret: %s\ntensor: %d\nranks:\n", benchGroup, secret, tensor)
	for _, ep := range eps {
		fmt.Fprintf(&b, "  - endpoint: %s\n", ep)
	}
	return []byte(b.String())
}

// startRank starts rank r of the group in file on CPU r.
func (lb *layoutBench) startRank(bin, file string, r int) (*rankProc, error) {
	cmd := exec.Command(bin, "--rank", fmt.Sprint(r), "--group-config", file, "--model", lb.mf.dir, "--threads", "1",
		"--cache-dtype", lb.mf.cache, "--draft-mode", "off", "--prefix-cache-enabled=false",
		"--micro-batches", fmt.Sprint(lb.micro), "--log-level", "warn")
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	p := &rankProc{cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := startPinned(cmd, r); errors.Is(err, errNoPin) {
		fmt.Fprintf(os.Stderr, "bench decodegroup: rank %d: %v; running with GOMAXPROCS 1 unpinned\n", r, err)
		err = cmd.Start()
		if err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// dialFormed connects to rank 0's front door and waits until the ring is
// formed, or a rank exits.
func dialFormed(ctx context.Context, addr string, secret []byte, procs []*rankProc) (*frontdoor.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	exited := make(chan error, 1)
	for r, p := range procs {
		go func() {
			select {
			case err := <-p.done:
				p.done <- err // for stopRanks
				select {
				case exited <- fmt.Errorf("rank %d exited (%v):\n%s", r, err, tail(p.out.String(), 2000)):
				default:
				}
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	fail := func(err error) error {
		select {
		case e := <-exited:
			return e
		default:
			return err
		}
	}
	head, err := frontdoor.Dial(ctx, addr, benchGroup, secret, kvtransfer.Timeouts{})
	if err != nil {
		return nil, fail(err)
	}
	for {
		st, err := head.Stats(ctx)
		if err == nil && st.Formed {
			return head, nil
		}
		if err != nil {
			head.Close()
			return nil, fail(err)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			head.Close()
			return nil, fail(fmt.Errorf("the ring did not form: %w", ctx.Err()))
		}
	}
}

// stopRanks ends the processes with SIGTERM (SIGKILL after 10 s).
func stopRanks(procs []*rankProc) {
	for _, p := range procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// decodeWorkerBinary is the decode-worker to run: path when given, else
// one beside this executable, else one built from the module this bench
// runs in (go run ./bench, go test: the worker of the same source) into a
// temporary directory, which cleanup removes, else one on $PATH. It says
// which.
func decodeWorkerBinary(ctx context.Context, path string) (bin string, cleanup func(), err error) {
	cleanup = func() {}
	if path != "" {
		if !isFile(path) {
			return "", cleanup, fmt.Errorf("--decode-worker %s: not a file", path)
		}
		return path, cleanup, nil
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), "decode-worker"); isFile(p) {
			fmt.Fprintf(os.Stderr, "bench decodegroup: running %s\n", p)
			return p, cleanup, nil
		}
	}
	hint := "--processes needs the decode-worker binary: give --decode-worker PATH, or put it on $PATH or beside bench (go build -o DIR ./decode-worker)"
	mod, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/tandem-inference/tandem").Output()
	if err != nil {
		if p, perr := exec.LookPath("decode-worker"); perr == nil {
			fmt.Fprintf(os.Stderr, "bench decodegroup: running %s (from $PATH)\n", p)
			return p, cleanup, nil
		}
		return "", cleanup, fmt.Errorf("%s; building it here: %v", hint, err)
	}
	dir, err := os.MkdirTemp("", "bench-decode-worker-")
	if err != nil {
		return "", cleanup, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, "decode-worker")
	fmt.Fprintf(os.Stderr, "bench decodegroup: building decode-worker into %s\n", dir)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./decode-worker")
	cmd.Dir = strings.TrimSpace(string(mod))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		cleanup()
		return "", func() {}, fmt.Errorf("%s; building it here: %v\n%s", hint, err, stderr.String())
	}
	return bin, cleanup, nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// freeAddrs picks n free loopback TCP addresses.
func freeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		out[i] = l.Addr().String()
		l.Close()
	}
	return out, nil
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// errNoPin is returned where a process cannot be pinned to a core; the
// rank then runs unpinned.
var errNoPin = errors.New("no core to pin to")
