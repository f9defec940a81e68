package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// The graces the shutdown tests give the ranks: small, so that a rank
// that waits one out shows, and the bound the tests hold them to.
const (
	testDrainGrace    = time.Second
	testShutdownGrace = 3 * time.Second
)

// waitLog waits until p's output holds line (the output is a buffer the
// process writes to: polling it is the only way to watch it).
func waitLog(ctx context.Context, t *testing.T, p *proc, what, line string) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(p.out.String(), line) {
		select {
		case <-tick.C:
		case <-p.done:
			if !strings.Contains(p.out.String(), line) {
				t.Fatalf("%s exited without logging %s:\n%s", what, line, tail(p.out.String(), 4000))
			}
		case <-ctx.Done():
			t.Fatalf("%s never logged %s:\n%s", what, line, tail(p.out.String(), 4000))
		}
	}
}

// startDecoding submits a job long enough to be decoding for the rest of
// the test and returns once the coordinator says it decodes. The job's
// client is stopped when the test ends.
func startDecoding(ctx context.Context, t *testing.T, d *deployment) {
	t.Helper()
	jobCtx, stop := context.WithCancel(ctx)
	decoding, ended := make(chan struct{}), make(chan error, 1)
	go func() {
		var once bool
		_, err := client.Run(jobCtx, d.cl, cp.SubmitRequest{TokenIDs: testkit.Prompt(9, d.model.VocabSize, 5), Sampling: cp.Sampling{MaxTokens: 32768}},
			client.Handlers{Event: func(ev cp.JobEvent) {
				if ev.State == cp.StateDecoding && !once {
					once = true
					close(decoding)
				}
			}})
		ended <- err
	}()
	t.Cleanup(func() { stop(); <-ended })
	select {
	case <-decoding:
	case err := <-ended:
		t.Fatalf("the job ended before it was decoding: %v", err)
	case <-ctx.Done():
		t.Fatal("the job did not start decoding")
	}
}

// sigtermWithinGraces sends the ranks SIGTERM together (as a machine
// shutting down does) and waits for each to exit 0 within its drain and
// shutdown graces; it returns their logs.
func (c *cluster) sigtermWithinGraces(t *testing.T, ranks ...int) map[int]string {
	t.Helper()
	for _, r := range ranks {
		if err := c.procs[r].cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	bound := time.NewTimer(testDrainGrace + testShutdownGrace)
	defer bound.Stop()
	logs := map[int]string{}
	for _, r := range ranks {
		p := c.procs[r]
		select {
		case <-p.done:
		case <-bound.C:
			t.Fatalf("rank %d did not exit within its graces (%v + %v) after SIGTERM:\n%s", r, testDrainGrace, testShutdownGrace,
				tail(p.out.String(), 4000))
		}
		t.Logf("rank %d exited %v after SIGTERM", r, time.Since(start).Round(time.Millisecond))
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("rank %d exited %d:\n%s", r, code, tail(p.out.String(), 4000))
		}
		c.procs[r] = nil // exited: nothing to stop
		logs[r] = p.out.String()
	}
	return logs
}

// logLine is the first line of log holding msg ("" when none).
func logLine(log, msg string) string {
	for line := range strings.Lines(log) {
		if strings.Contains(line, msg) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

func graceFlags() []string {
	return []string{"--log-format", "json", "--drain-grace", testDrainGrace.String(), "--shutdown-grace", testShutdownGrace.String()}
}

// TestShutdownAfterNATSDies kills the nats-server under a registered
// decode group of two processes, idle or with a job decoding, then sends
// both ranks SIGTERM: each exits 0 within its graces, saying that it shuts
// down and that it left without deregistering for want of a connection.
func TestShutdownAfterNATSDies(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	for _, running := range []bool{false, true} {
		name := "idle"
		if running {
			name = "job-decoding"
		}
		t.Run(name, func(t *testing.T) {
			ctx := testctx.Context(t)
			srv := natstest.StartProcess(t, natstest.Config{})
			d := newDeployment(ctx, t, dir, srv.URL, nil)
			c := d.group(t, dir, 2, graceFlags()...)
			d.waitRegistered(ctx, t, 2)
			if running {
				startDecoding(ctx, t, d)
			}
			srv.Kill()
			// Each rank has seen the server stay away.
			for r, p := range c.procs {
				waitLog(ctx, t, p, fmt.Sprintf("rank %d", r), `"msg":"nats reconnect failed; retrying"`)
			}
			for r, log := range c.sigtermWithinGraces(t, 0, 1) {
				// It left at once: the deregistration was skipped for want
				// of a connection, not cut short by the shutdown grace.
				leaving := logLine(log, `"msg":"control plane: leaving"`)
				if !strings.Contains(leaving, "not connected") || strings.Contains(leaving, "deadline exceeded") {
					t.Errorf("rank %d did not skip its deregistration for want of a connection: %q", r, leaving)
				}
				want := []string{`"msg":"shutting down: draining"`}
				if running && r == 0 {
					// Rank 0 still held the job when it began to drain
					// (for its drain grace: NATS might have come back).
					// How the job then ended races with rank 1's exit
					// at the same grace's end (cancelled, or the ring
					// broken), and either is fine.
					want = append(want, `"msg":"draining: no new jobs","worker":"ptest-r0","running":1,`)
				}
				for _, line := range want {
					if !strings.Contains(log, line) {
						t.Errorf("rank %d's log lacks %s:\n%s", r, line, tail(log, 4000))
					}
				}
			}
		})
	}
}

// TestShutdownAfterPeerKilled: in a registered decode group of two
// processes decoding a job, one rank is killed (SIGKILL), then the other
// is sent SIGTERM: it exits 0 within its graces (its mesh link to the
// dead peer does not hold it), deregistered, saying so.
func TestShutdownAfterPeerKilled(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	for _, killed := range []int{0, 1} {
		for _, running := range []bool{false, true} {
			name := fmt.Sprintf("rank%d-killed-idle", killed)
			if running {
				name = fmt.Sprintf("rank%d-killed-job-decoding", killed)
			}
			t.Run(name, func(t *testing.T) {
				ctx := testctx.Context(t)
				d := startDeployment(ctx, t, dir)
				c := d.group(t, dir, 2, graceFlags()...)
				d.waitRegistered(ctx, t, 2)
				if running {
					startDecoding(ctx, t, d)
				}
				left := 1 - killed
				c.kill(killed)
				c.procs[killed] = nil
				// The survivor has seen its links to the peer go down
				// (it keeps redialling the peer from now on).
				waitLog(ctx, t, c.procs[left], fmt.Sprintf("rank %d", left), `"msg":"mesh: link down"`)
				log := c.sigtermWithinGraces(t, left)[left]
				for _, line := range []string{`"msg":"shutting down: draining"`, `"msg":"left the control plane: deregistered"`} {
					if !strings.Contains(log, line) {
						t.Errorf("rank %d's log lacks %s:\n%s", left, line, tail(log, 4000))
					}
				}
			})
		}
	}
}
