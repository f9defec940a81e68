//go:build linux

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/internal/heldbackend"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
)

// openPTY opens a pseudo-terminal pair through /dev/ptmx: the program
// writes to the terminal side, the test reads what a screen would show
// from the master side.
func openPTY(t *testing.T) (master, term *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Fatalf("unlock the pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatalf("open the terminal side: %v", err)
	}
	return m, s
}

// screen collects what is written to a pty until its terminal side closes.
type screen struct {
	mu    sync.Mutex
	b     bytes.Buffer
	done  chan struct{}
	wrote chan struct{} // a token per read
}

func readScreen(m *os.File) *screen {
	s := &screen{done: make(chan struct{}), wrote: make(chan struct{}, 1)}
	go func() {
		defer close(s.done)
		buf := make([]byte, 4096)
		for {
			n, err := m.Read(buf)
			s.mu.Lock()
			s.b.Write(buf[:n])
			s.mu.Unlock()
			select {
			case s.wrote <- struct{}{}:
			default:
			}
			if err != nil { // EIO once the terminal side is closed
				return
			}
		}
	}()
	return s
}

// waitFor waits until the screen shows text matching re.
func (s *screen) waitFor(ctx context.Context, t *testing.T, re *regexp.Regexp) {
	t.Helper()
	text := re.String()
	for !re.MatchString(s.String()) {
		select {
		case <-s.wrote:
		case <-s.done:
			t.Fatalf("the terminal closed without showing %q:\n%q", text, s.String())
		case <-ctx.Done():
			t.Fatalf("the terminal does not show %q:\n%q", text, s.String())
		}
	}
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSubmitShowsProgressOnATerminal: `coordinator submit` of a remote job
// draws the job's steps on stderr when stderr is a terminal (a real pty):
// the queueing, the route, the weight pass, the layers prefilled n/N (the
// pass is held at a layer until the terminal shows it), then the first
// token; with stderr a pipe it prints none of
// that, only the report at the end; --json prints the events and the
// tokens as JSON lines on stdout.
func TestSubmitShowsProgressOnATerminal(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ids := cp.NewIdentities()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held := heldbackend.New(cpu.New(1), 3, true)
	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, Threads: 1, Identities: ids,
		Queue: cp.QueueConfig{Memory: true}, Registry: cp.RegistryConfig{Memory: true, TTL: 2 * time.Second},
		PrefillBackend: func() kernels.Backend { return held }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Released before the cluster closes (defers run last first), also
	// when the test fails holding it.
	defer held.Resume()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "client.json")
	if err := cp.SaveIdentity(creds, cp.Find(ids, cp.PrincipalClient)); err != nil {
		t.Fatal(err)
	}
	args := func(key string, extra ...string) []string {
		return append([]string{"submit", "--ids", "5,17,200,31,7,9", "--max-tokens", "4", "--policy", "remote",
			"--key", key, "--nats-url", c.URL, "--nats-credentials", creds}, extra...)
	}

	// A terminal.
	master, term := openPTY(t)
	defer master.Close()
	scr := readScreen(master)
	var out bytes.Buffer
	root := New(&out, term)
	root.SetArgs(args("tty"))
	ran := make(chan error, 1)
	go func() { ran <- root.ExecuteContext(ctx) }()
	// The pass holds at layer 3: the terminal shows the layers done so far
	// (the worker reports its first layer at once, then every
	// progress interval).
	scr.waitFor(ctx, t, regexp.MustCompile(`prefilling on prefill-0: layers [1-3]/[0-9]+`))
	held.Resume()
	err = <-ran
	term.Close()
	<-scr.done
	shown := scr.String()
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, shown)
	}
	if n := len(strings.Fields(out.String())); n != 4 {
		t.Fatalf("stdout %q: want 4 token ids", out.String())
	}
	// (The transfer's step is too short here to be drawn for sure:
	// TestProgressView shows its text.)
	for _, want := range []string{"queued:", "routed remote", "waiting for a weight pass on prefill-0", "first token after ", "time to first token"} {
		if !strings.Contains(shown, want) {
			t.Errorf("the terminal does not show %q:\n%q", want, shown)
		}
	}
	// The status line is rewritten in place: carriage returns, and the
	// line cleared (overwritten with spaces) before the first token's.
	i, j := strings.LastIndex(shown, "layers "), strings.Index(shown, "first token after")
	if i < 0 || j < i || !strings.Contains(shown[i:j], "\r"+strings.Repeat(" ", 20)) {
		t.Errorf("the status line is not cleared before the first token:\n%q", shown)
	}

	// A pipe: quiet until the report.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	piped := make(chan string, 1)
	go func() { b, _ := io.ReadAll(r); piped <- string(b) }()
	out.Reset()
	root = New(&out, w)
	root.SetArgs(args("pipe"))
	err = root.ExecuteContext(ctx)
	w.Close()
	report := <-piped
	r.Close()
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, report)
	}
	if strings.ContainsAny(report, "\r") || strings.Contains(report, "prefilling") || strings.Contains(report, "waiting") ||
		strings.Contains(report, "queued") {
		t.Errorf("piped stderr shows progress:\n%q", report)
	}
	for _, want := range []string{"routed remote", "job k-", "done (length)", "time to first token"} {
		if !strings.Contains(report, want) {
			t.Errorf("piped stderr lacks %q in the report:\n%s", want, report)
		}
	}

	// --json: events and tokens, one JSON object a line.
	out.Reset()
	var errw bytes.Buffer
	root = New(&out, &errw)
	root.SetArgs(args("json", "--json"))
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("submit --json: %v\n%s", err, errw.String())
	}
	var states []cp.JobState
	var tokens []int32
	final := false
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var probe map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &probe); err != nil {
			t.Fatalf("--json line %q: %v", line, err)
		}
		switch {
		case probe["state"] != nil:
			var ev cp.JobEvent
			if err := cp.Unmarshal(cp.JSON, []byte(line), &ev); err != nil {
				t.Fatalf("event %q: %v", line, err)
			}
			states = append(states, ev.State)
		case probe["index"] != nil:
			var tm cp.TokenMsg
			if err := cp.Unmarshal(cp.JSON, []byte(line), &tm); err != nil {
				t.Fatalf("token %q: %v", line, err)
			}
			if tm.TokenID >= 0 {
				tokens = append(tokens, tm.TokenID)
			}
			final = final || tm.Final
		default:
			t.Fatalf("--json line %q is neither an event nor a token", line)
		}
	}
	if len(tokens) != 4 || !final || len(states) == 0 || states[0] != cp.StateQueued || states[len(states)-1] != cp.StateDone {
		t.Fatalf("--json: tokens %v (final %v), states %v", tokens, final, states)
	}
	if errw.Len() > 0 && strings.Contains(errw.String(), "prefilling") {
		t.Errorf("--json drew progress on stderr: %q", errw.String())
	}
}
