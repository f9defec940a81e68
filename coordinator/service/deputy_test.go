package service_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/metrics"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestNoReplyOutsideTheAskersInbox is the confused-deputy attack: a client
// identity (mallory) sends requests on its own request subjects, which the
// server lets it publish, naming as reply subject what it may not publish
// on itself: the job queue's purge API, the results bucket's purge API, a
// worker's registry key, another client's inbox and the coordinator's own.
// Were the coordinator to answer there with its permissions, the queue
// would be purged (accepted jobs lost) and the registry corrupted. Each
// such request is dropped unanswered, counted and logged (the first five a
// minute); the victim's four jobs, three of them waiting in the queue
// during the attack, all end done with the reference's tokens, each routed
// once, and the result of the victim's earlier job is still stored. Mallory's requests with her
// own inbox are answered as before.
func TestNoReplyOutsideTheAskersInbox(t *testing.T) {
	for _, kind := range []string{"embedded", "process"} {
		t.Run(kind, func(t *testing.T) {
			ids := append(cp.NewIdentities(), cp.NewIdentity(cp.PrincipalClient, "mallory"))
			opt := testOptions(t)
			opt.Identities = ids
			if kind == "process" {
				opt.NATSURL, _ = secureProcess(t, ids)
			}
			// One job at a time: the others wait in the queue.
			opt.Coordinator.MaxRunning = 1
			m := metrics.New()
			opt.Coordinator.Metrics = m
			core, logs := observer.New(zapcore.WarnLevel)
			opt.Coordinator.Log = zap.New(zapcore.NewTee(core, testkit.Logger(t).Core()))
			c := startCluster(t, opt)
			ref := testmodel.LoadReference(t, opt.ModelDir, 1)
			victim := connect(t, c)
			mallory := connectIntruder(t, c.URL, &ids[3])
			mallory.snoop(t, cp.InboxPrefix(cp.PrincipalClient, "mallory")+".>")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			co, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "test-observer")
			if err != nil {
				t.Fatal(err)
			}
			defer co.Close()
			js, err := co.JetStream()
			if err != nil {
				t.Fatal(err)
			}

			// An earlier job: its result is stored.
			first := run(t, victim, cp.SubmitRequest{TokenIDs: testkit.Prompt(20, c.Model.VocabSize, 1), Sampling: cp.Sampling{MaxTokens: 4}})
			results, err := js.KeyValue(cp.ResultsBucket)
			if err != nil {
				t.Fatal(err)
			}
			stored := func() []string {
				keys, err := results.Keys()
				if err != nil {
					t.Fatalf("results bucket: %v", err)
				}
				return keys
			}
			if len(stored()) != 1 {
				t.Fatalf("results before the attack: %q, want job %s's", stored(), first.JobID)
			}

			// Four jobs: a long one runs, three wait in the queue.
			prompts := [][]int32{testkit.Prompt(100, c.Model.VocabSize, 11), testkit.Prompt(30, c.Model.VocabSize, 12),
				testkit.Prompt(31, c.Model.VocabSize, 13), testkit.Prompt(32, c.Model.VocabSize, 14)}
			lens := []int{300, 8, 8, 8}
			res := make([]*client.Result, len(prompts))
			errs := make([]error, len(prompts))
			routed := make([]int, len(prompts))
			queued := make(chan struct{}, len(prompts))
			var wg sync.WaitGroup
			for i := range prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res[i], errs[i] = client.Run(ctx, victim, cp.SubmitRequest{TokenIDs: prompts[i], Sampling: cp.Sampling{MaxTokens: lens[i]}},
						client.Handlers{Event: func(ev cp.JobEvent) {
							switch ev.State {
							case cp.StateQueued:
								queued <- struct{}{}
							case cp.StateRouted:
								routed[i]++
							}
						}})
				}()
			}
			for range prompts {
				select {
				case <-queued:
				case <-ctx.Done():
					t.Fatal("the victim's jobs were not all queued")
				}
			}

			// The attack: each of mallory's request subjects, with reply
			// subjects she may not publish on.
			own := func(s string) string { return cp.ClientPrefix("mallory") + "." + s }
			attacks := []struct{ subject, reply string }{
				{own("submit"), "$JS.API.STREAM.PURGE." + cp.JobsStream},
				{own("cancel"), "$JS.API.STREAM.PURGE." + cp.JobsStream},
				{own("list"), "$JS.API.STREAM.PURGE.KV_" + cp.ResultsBucket},
				{own("availability"), "$JS.API.STREAM.PURGE." + cp.JobsStream},
				{own("submit"), cp.HeartbeatSubject(c.RankID(0))},
				{own("list"), cp.HeartbeatSubject(c.RankID(0))},
				{own("list"), cp.InboxPrefix(cp.PrincipalClient, cp.DefaultClient) + ".stolen"},
				{own("list"), "_INBOX.coordinator-reply"},
				{own("list"), cp.InboxPrefix(cp.PrincipalClient, "mallory") + ".*"},
				{own("list"), cp.InboxPrefix(cp.PrincipalClient, "mallory")},
			}
			bodies := map[string]string{"submit": `{"token_ids":[1,2,3],"max_tokens":1}`, "cancel": `{"job_id":"k-aaaaaaaaaaaaaaaaaaaa"}`}
			for _, a := range attacks {
				body := bodies[a.subject[len(cp.ClientPrefix("mallory"))+1:]]
				if body == "" {
					body = "{}"
				}
				if err := mallory.nc.PublishRequest(a.subject, a.reply, []byte(body)); err != nil {
					t.Fatal(err)
				}
			}
			// Settled: the coordinator counted every request it dropped.
			for deadline := time.Now().Add(30 * time.Second); droppedRequests(t, m) < len(attacks); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("dropped_requests_total is %d, want %d", droppedRequests(t, m), len(attacks))
				}
			}
			if n := droppedRequests(t, m); n != len(attacks) {
				t.Fatalf("dropped_requests_total is %d, want %d", n, len(attacks))
			}
			// Logged, but at most five a minute: a flood does not fill the
			// log (the ten came within a second).
			if n := logs.FilterMessageSnippet("client request dropped unanswered").Len(); n != 5 {
				t.Fatalf("the coordinator logged %d of %d dropped requests, want the first 5", n, len(attacks))
			}
			info, err := js.StreamInfo(cp.JobsStream)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs == 0 {
				t.Fatalf("the job queue is empty after the attack (purged, or every job already ran: make the first longer)")
			}
			// Mallory's own requests are answered on her inbox.
			if _, err := cp.ListJobs(ctx, mallory.nc, &cp.ListJobsRequest{}); err != nil {
				t.Fatalf("mallory's list with her own inbox: %v", err)
			}

			wg.Wait()
			for i := range prompts {
				if errs[i] != nil {
					t.Fatalf("job %d: %v", i, errs[i])
				}
				if res[i].Final.State != cp.StateDone || !slices.Equal(res[i].Tokens, ref.Greedy(t, prompts[i], lens[i])) {
					t.Fatalf("job %d: %s with %d tokens, want done with the reference's %d", i, res[i].Final.State, len(res[i].Tokens), lens[i])
				}
				if routed[i] != 1 {
					t.Fatalf("job %d was routed %d times, want once", i, routed[i])
				}
			}
			if got := stored(); len(got) != 1+len(prompts) {
				t.Fatalf("results after the attack: %d (%q), want %d", len(got), got, 1+len(prompts))
			}
			// Only the answer to her own list reached mallory's inbox.
			if err := mallory.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if got := mallory.received(); len(got) != 1 {
				t.Fatalf("mallory received %d messages, want only her list's answer", len(got))
			}
		})
	}
}

// droppedRequests is the sum of dropped_requests_total over its labels.
func droppedRequests(t *testing.T, m *metrics.Metrics) int {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, f := range fams {
		if strings.HasSuffix(f.GetName(), "dropped_requests_total") {
			for _, x := range f.GetMetric() {
				n += x.GetCounter().GetValue()
			}
		}
	}
	return int(n)
}
