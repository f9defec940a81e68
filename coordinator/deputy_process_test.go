package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestClientCannotPurgeThroughTheCoordinator is the confused-deputy attack
// on a coordinator process with its embedded server: with the ordinary
// client identity, requests on the client's own request subjects name as
// reply subject the job queue's purge API, the results bucket's purge API
// and a worker's registry key. The coordinator drives one job at a time,
// so three of the four jobs wait in the queue during the attack. Nothing is
// purged: the requests are dropped (logged), every job ends with the
// reference's tokens, each admitted and finished once by the decode group.
func TestClientCannotPurgeThroughTheCoordinator(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator process: not in -short")
	}
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ref := testmodel.LoadReference(t, dir, 1)
	port := freePort(t)
	creds, ids := credentials(t)
	co := startCoordinator(t, "--model", dir, "--embedded-port", fmt.Sprint(port), "--embedded-data-dir", t.TempDir(),
		"--embedded-credentials-dir", creds, "--max-running", "1", "--metrics-listen", "127.0.0.1:0")
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	c := startWorkers(t, dir, url, ids, 1, 3*time.Second)

	lens := []int{300, 8, 8, 8}
	var jobs []*job
	for i, n := range lens {
		p := testkit.Prompt(20+i, 256, 300+i)
		jobs = append(jobs, follow(t, url, ids, cp.SubmitRequest{TokenIDs: p, Sampling: cp.Sampling{MaxTokens: n}, Policy: cp.PolicyLocal},
			ref.Greedy(t, p, n)))
	}
	for _, j := range jobs {
		<-j.queued
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mallory, err := connectAs(ctx, url, ids, cp.PrincipalClient, "mallory")
	if err != nil {
		t.Fatal(err)
	}
	defer mallory.Close()
	client := cp.ClientName(mallory)
	replies := []string{"$JS.API.STREAM.PURGE." + cp.JobsStream, "$JS.API.STREAM.PURGE.KV_" + cp.ResultsBucket,
		cp.HeartbeatSubject(c.RankID(0))}
	sent := 0
	for _, reply := range replies {
		for _, req := range []struct{ subject, body string }{
			{cp.ClientSubmit(client), `{"token_ids":[1,2,3],"max_tokens":1}`},
			{cp.ClientCancel(client), `{"job_id":"k-aaaaaaaaaaaaaaaaaaaa"}`},
			{cp.ClientList(client), `{}`},
			{cp.ClientAvailability(client), `{}`},
		} {
			if err := mallory.PublishRequest(req.subject, reply, []byte(req.body)); err != nil {
				t.Fatal(err)
			}
			sent++
		}
	}
	// Settled: the coordinator counted each request it dropped, and logged
	// the first five (a flood does not fill its log).
	base := co.metricsBase(t)
	for deadline := time.Now().Add(30 * time.Second); droppedTotal(t, base) < sent; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("dropped_requests_total is %d, want %d", droppedTotal(t, base), sent)
		}
	}
	if n := strings.Count(co.log.String(), "client request dropped unanswered"); n != 5 {
		t.Fatalf("the coordinator logged %d of %d dropped requests, want the first 5", n, sent)
	}
	// The queue still holds the jobs not yet done.
	obs, err := connectAs(ctx, url, ids, cp.PrincipalCoordinator, "observer")
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	js, err := jetstream.New(obs)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, cp.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	si, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if si.State.Msgs == 0 {
		t.Fatal("the job queue is empty after the attack (purged, or every job already ran: make the first longer)")
	}
	for _, j := range jobs {
		j.check(t)
	}
	settled(t, url, ids, c)
	ranOnce(t, c, jobs)
}

// droppedTotal sums tandem_coordinator_dropped_requests_total over its
// labels, from the coordinator's /metrics at base.
func droppedTotal(t *testing.T, base string) int {
	t.Helper()
	_, b := testkit.Get(t, base+"/metrics")
	n := 0
	for _, line := range strings.Split(b, "\n") {
		if rest, ok := strings.CutPrefix(line, "tandem_coordinator_dropped_requests_total{"); ok {
			var v float64
			if _, err := fmt.Sscan(rest[strings.LastIndexByte(rest, ' ')+1:], &v); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			n += int(v)
		}
	}
	return n
}
