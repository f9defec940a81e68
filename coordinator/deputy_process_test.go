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
		"--embedded-credentials-dir", creds, "--max-running", "1")
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
	// Settled: the coordinator logged each request it dropped.
	const dropped = "client request dropped unanswered"
	for deadline := time.Now().Add(30 * time.Second); strings.Count(co.log.String(), dropped) < sent; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the coordinator logged %d of %d dropped requests", strings.Count(co.log.String(), dropped), sent)
		}
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
