package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cli"
	"github.com/tandem-inference/tandem/internal/health/healthtest"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// metricsBase waits for the coordinator process to log where it serves
// /metrics and returns the endpoint's base URL.
func (c *coordinator) metricsBase(t *testing.T) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		for _, line := range strings.Split(c.log.String(), "\n") {
			var l struct{ Msg, URL string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "metrics and health" {
				return strings.TrimSuffix(l.URL, "/metrics")
			}
		}
		select {
		case <-c.done:
			t.Fatal("the coordinator exited")
		case <-deadline:
			t.Fatal("the coordinator logged no metrics address in 60s")
		case <-time.After(20 * time.Millisecond): // polling its log for the line
		}
	}
}

// TestMetricsAndHistoryAcrossRestart runs a coordinator process with its
// operations endpoint on: after a remote job, its /metrics (the exposition
// parsed) counts the job, its time to first token, its inter-token
// latency and its tokens, and exports every coordinator metric the Grafana
// dashboard queries; /healthz and /readyz answer. The coordinator is then
// stopped (SIGTERM) and started again on the same data directory: the
// client's `coordinator jobs` still lists the job, read from the results
// kept in JetStream. The worker identity cannot read that history.
func TestMetricsAndHistoryAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a coordinator process: not in -short")
	}
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 1)
	port, data := freePort(t), t.TempDir()
	creds, ids := credentials(t)
	args := []string{"--model", dir, "--embedded-port", fmt.Sprint(port), "--embedded-data-dir", data, "--embedded-credentials-dir", creds,
		"--metrics-listen", "127.0.0.1:0"}
	co := startCoordinator(t, args...)
	base := co.metricsBase(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	startWorkers(t, dir, url, ids, 1, 3*time.Second)

	p := testkit.Prompt(40, 256, 7)
	j := follow(t, url, ids, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: 6}, Policy: cp.PolicyRemote}, ref.Greedy(t, p, 6))
	j.check(t)

	f, err := healthtest.Scrape(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tandem_coordinator_jobs_total", []string{"state", "done"}, 1},
		{"tandem_coordinator_ttft_seconds", []string{"target", "remote"}, 1},
		// One observation for the job, not one per gap between its 6 tokens.
		{"tandem_coordinator_job_mean_inter_token_seconds", []string{"target", "remote"}, 1},
		{"tandem_coordinator_tokens_total", []string{"kind", "prompt"}, 40},
		{"tandem_coordinator_tokens_total", []string{"kind", "output"}, 6},
		{"tandem_coordinator_route_decisions_total", []string{"target", "remote"}, 1},
	} {
		if got := f.Value(x.name, x.labels...); got != x.want {
			t.Errorf("%s%v = %v, want %v", x.name, x.labels, got, x.want)
		}
	}
	missing, err := f.DashboardsMissing("tandem_coordinator_", "go_", "process_")
	if err != nil || len(missing) > 0 {
		t.Errorf("dashboard metrics the coordinator does not export: %v %v", missing, err)
	}
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		if code, body, err := healthtest.Get(base + path); err != nil || code != http.StatusOK || body != want {
			t.Errorf("%s: %d %q %v", path, code, body, err)
		}
	}

	// A clean stop and a new coordinator process on the same data.
	if err := co.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-co.done:
	case <-time.After(time.Minute):
		t.Fatal("the coordinator did not stop on SIGTERM")
	}
	startCoordinator(t, args...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errw bytes.Buffer
	code := cli.Execute(ctx, []string{"jobs", "--nats-url", url, "--nats-credentials", cp.IdentityFile(creds, cp.PrincipalClient)}, &out, &errw)
	if code != 0 {
		t.Fatalf("jobs: exit %d: %s", code, errw.String())
	}
	var line string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, j.res.JobID+" ") {
			line = l
		}
	}
	if !strings.Contains(line, " done ") || !strings.Contains(line, "remote") || !strings.Contains(line, "40+6") {
		t.Fatalf("after the restart, jobs does not show the job done (remote, 40+6 tokens):\n%s", out.String())
	}

	// The worker identity reads no history: not the results bucket, not a
	// client's list.
	wnc, err := connectAs(ctx, url, ids, cp.PrincipalWorker, "nosy-worker")
	if err != nil {
		t.Fatal(err)
	}
	defer wnc.Close()
	js, err := jetstream.New(wnc)
	if err != nil {
		t.Fatal(err)
	}
	// A denied request goes unanswered: each waits out a short bound.
	kctx, stopK := context.WithTimeout(ctx, 2*time.Second)
	defer stopK()
	if kv, err := js.KeyValue(kctx, cp.ResultsBucket); err == nil {
		if _, err := kv.Get(kctx, cp.DefaultClient+"."+j.res.JobID); err == nil {
			t.Fatal("the worker identity read a job's result")
		}
	}
	lctx, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	var rep cp.ListJobsReply
	if err := cp.Request(lctx, wnc, cp.ClientList(cp.DefaultClient), &cp.ListJobsRequest{}, &rep); err == nil {
		t.Fatalf("the worker identity listed a client's jobs: %+v", rep)
	}
}
