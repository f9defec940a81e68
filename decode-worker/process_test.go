package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tandem-inference/tandem/decode-worker/frontdoor"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/internal/syncbuf"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
)

// childEnv makes the test binary run as a decode-worker process: the tests
// re-execute themselves instead of building the binary.
const childEnv = "TANDEM_DECODE_WORKER_CHILD"

func TestMain(m *testing.M) {
	testkit.Child(childEnv, func(ctx context.Context, args []string) int {
		if err := run(ctx, args, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "decode-worker: %v\n", err)
			return 1
		}
		return 0
	})
	goleak.VerifyTestMain(testkit.Isolated(m))
}

var (
	groupSecret    = "process-test-group-secret-0123456789"
	transferSecret = []byte("process-test-transfer-secret-0123")
	fastTimeouts   = kvtransfer.Timeouts{Handshake: 2 * time.Second, IO: 5 * time.Second}
)

// cluster is a decode group of processes on loopback.
type cluster struct {
	t      *testing.T
	model  string
	file   string
	layout *rank.Layout
	procs  []*proc
	extra  []string
}

type proc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer = syncbuf.Buffer

func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var ls []net.Listener
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

// startCluster writes a group config for ranks processes (rankYAML adds
// per-rank keys) and starts them.
func startCluster(t *testing.T, modelDir string, ranks int, rankYAML func(r int) string, extra ...string) *cluster {
	t.Helper()
	return startTensorCluster(t, modelDir, ranks, 1, rankYAML, extra...)
}

// startTensorCluster is startCluster for stages of tensor ranks each.
func startTensorCluster(t *testing.T, modelDir string, ranks, tensor int, rankYAML func(r int) string, extra ...string) *cluster {
	t.Helper()
	cfg, err := model.LoadConfig(filepath.Join(modelDir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	eps := freePorts(t, ranks)
	var y strings.Builder
	fmt.Fprintf(&y, "group: ptest\nsecret: %s\ntensor: %d\nranks:\n", groupSecret, tensor)
	for r, ep := range eps {
		fmt.Fprintf(&y, "  - endpoint: %s\n", ep)
		if rankYAML != nil {
			y.WriteString(rankYAML(r))
		}
	}
	file := filepath.Join(t.TempDir(), "group.yaml")
	if err := os.WriteFile(file, []byte(y.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	layout, _, err := loadGroup(file, cfg.NumLayers)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, model: modelDir, file: file, layout: layout, procs: make([]*proc, ranks), extra: extra}
	t.Cleanup(c.stop)
	for r := range c.procs {
		c.start(r)
	}
	return c
}

func (c *cluster) start(r int) {
	c.t.Helper()
	args := append([]string{"--rank", fmt.Sprint(r), "--group-config", c.file, "--model", c.model, "--threads", "2"}, c.extra...)
	cmd := exec.Command(os.Args[0], args...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), childEnv+"=1", "TANDEM_DECODE_WORKER_MESH_HEARTBEAT=200ms", "TANDEM_DECODE_WORKER_MESH_IDLE=3s")
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.ENOEXEC) {
			// An emulated test binary (scripts/test.sh runs this package
			// for arm64 under qemu-user) cannot start itself where the
			// kernel has no binfmt_misc entry for its architecture.
			c.t.Skipf("the rank processes cannot start: %v (an emulated test binary without binfmt_misc)", err)
		}
		c.t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: out, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	c.procs[r] = p
}

// kill kills rank r with SIGKILL and waits for it to be gone.
func (c *cluster) kill(r int) {
	p := c.procs[r]
	p.cmd.Process.Kill()
	<-p.done
}

func (c *cluster) stop() {
	for _, p := range c.procs {
		if p != nil {
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for r, p := range c.procs {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
			c.t.Errorf("rank %d did not stop on SIGTERM within 10 s", r)
		}
		if c.t.Failed() {
			c.t.Logf("rank %d output:\n%s", r, tail(p.out.String(), 4000))
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func (c *cluster) client(ctx context.Context, r int) *frontdoor.Client {
	c.t.Helper()
	cl, err := frontdoor.Dial(ctx, c.layout.Ranks[r].Endpoint, "ptest", []byte(groupSecret), fastTimeouts)
	if err != nil {
		c.t.Fatalf("rank %d: %v", r, err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// waitFormed polls the head until the ring is formed.
func waitFormed(ctx context.Context, t *testing.T, head *frontdoor.Client) {
	t.Helper()
	for {
		st, err := head.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Formed {
			return
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("the ring did not form: %v", ctx.Err())
		}
	}
}

// send moves a state for the cluster's layout with kvtransfer.
func (c *cluster) send(ctx context.Context, st *model.SeqState, session string) error {
	place := kvtransfer.LayerMap{}
	for _, s := range c.layout.Ranks {
		for L := s.Lo; L < s.Hi; L++ {
			place[L] = s.Endpoint
		}
	}
	return kvtransfer.SendState(ctx, kvtransfer.SenderConfig{Session: session, Secret: transferSecret, Placement: place,
		Deadline: time.Now().Add(60 * time.Second)}, st)
}

func (c *cluster) remote(session string, tokens int) *pipeline.Remote {
	rm := &pipeline.Remote{Tokens: tokens, Deadline: time.Now().Add(60 * time.Second)}
	for range c.layout.Ranks {
		rm.Sessions = append(rm.Sessions, pipeline.Session{ID: session, Secret: transferSecret})
	}
	return rm
}
