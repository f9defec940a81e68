package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/internal/health/healthtest"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestShutdownAfterNATSDies kills the NATS server under a coordinator
// process, then sends the coordinator SIGTERM: it exits 0 within its
// shutdown grace, saying it stopped, whether it was idle or driving a job
// (which can neither finish nor be handed back without NATS). Idle, it
// took over 5 s: stopping its registry watch deleted the watch's consumer
// with a JetStream request that waited out the API timeout.
func TestShutdownAfterNATSDies(t *testing.T) {
	if testing.Short() {
		t.Skip("coordinator and NATS processes: not in -short")
	}
	dir := testmodel.Dir(t, "tiny", 1, 2)
	for _, running := range []bool{false, true} {
		name := "idle"
		if running {
			name = "job-running"
		}
		t.Run(name, func(t *testing.T) {
			srv := natstest.StartProcess(t, natstest.Config{})
			// The worker requests the hand-back would make time out after
			// --timeouts-assign (10 s).
			const grace, handBack = 3 * time.Second, 2 * time.Second
			co := startCoordinator(t, "--model", dir, "--nats-url", srv.URL, "--timeouts-shutdown-grace", grace.String(),
				"--metrics-listen", "127.0.0.1:0")
			base := co.metricsBase(t)
			if running {
				ctx := testctx.Context(t)
				c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, NATSURL: srv.URL, NoCoordinator: true, Threads: 1,
					Registry: cp.RegistryConfig{TTL: 3 * time.Second}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				if err := c.WaitReady(ctx); err != nil {
					t.Fatal(err)
				}
				nc, err := cp.Connect(ctx, cp.Options{URL: srv.URL, Name: "client"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				// A job long enough to be decoding when NATS goes.
				decoding, ended := make(chan struct{}), make(chan error, 1)
				go func() {
					_, err := client.Run(ctx, nc, cp.SubmitRequest{TokenIDs: testkit.Prompt(20, 256, 3), Sampling: cp.Sampling{MaxTokens: 32768}},
						client.Handlers{Event: func(ev cp.JobEvent) {
							if ev.State == cp.StateDecoding {
								close(decoding)
							}
						}})
					ended <- err
				}()
				select {
				case <-decoding:
				case err := <-ended:
					t.Fatalf("the job ended before it was decoding: %v", err)
				case <-ctx.Done():
					t.Fatal("the job did not start decoding")
				}
			}
			srv.Kill()
			// The coordinator has seen the loss (it is no longer ready)
			waitStatus(t, co, base+"/readyz", http.StatusServiceUnavailable, "nats")
			// and has tried to reconnect: it hung only once the server
			// had stayed away (the watch's consumer deleted at once
			// right after the loss).
			waitLog(t, co, `"msg":"nats reconnect failed; retrying"`)

			if err := co.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			// Idle, it leaves at once; a running job may go on for the
			// grace (NATS may come back), then it goes back to the queue
			// without asking workers that cannot be reached.
			bound := grace
			if running {
				bound += handBack
			}
			start := time.Now()
			select {
			case <-co.done:
			case <-time.After(bound):
				t.Fatalf("the coordinator did not exit within %v after SIGTERM with NATS gone (shutdown grace %v)", bound, grace)
			}
			t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
			if code := co.cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("exit code %d", code)
			}
			if log := co.log.String(); !strings.Contains(log, `"msg":"coordinator stopped"`) {
				t.Fatalf("the coordinator did not log that it stopped")
			}
		})
	}
}

// waitStatus polls url until it answers want with a body containing
// contains.
func waitStatus(t *testing.T, co *coordinator, url string, want int, contains string) {
	t.Helper()
	ctx := testctx.Context(t)
	for {
		code, body, err := healthtest.Get(url)
		if err == nil && code == want && strings.Contains(body, contains) {
			return
		}
		select {
		case <-co.done:
			t.Fatal("the coordinator exited")
		case <-ctx.Done():
			t.Fatalf("%s: %d %q %v, want %d with %q", url, code, body, err, want, contains)
		case <-time.After(20 * time.Millisecond): // polling the endpoint
		}
	}
}

// waitLog waits for the coordinator's log to contain line.
func waitLog(t *testing.T, co *coordinator, line string) {
	t.Helper()
	ctx := testctx.Context(t)
	for !strings.Contains(co.log.String(), line) {
		select {
		case <-co.done:
			t.Fatal("the coordinator exited")
		case <-ctx.Done():
			t.Fatalf("the coordinator did not log %s", line)
		case <-time.After(20 * time.Millisecond): // polling its log
		}
	}
}
