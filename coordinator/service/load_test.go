package service_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/internal/testkit"
)

// tracker follows every job on the wildcard subjects: when it was routed
// (its assignment goes out), when its assignment was accepted (the
// prefilling event), how it ended, its token messages.
type tracker struct {
	mu       sync.Mutex
	sent     map[string]time.Time
	routed   map[string]time.Time
	assigned map[string]time.Time
	final    map[string]cp.JobEvent
	finals   map[string]int
	tokens   map[string]int
	changed  chan struct{}
	subs     []*nats.Subscription
}

func track(t testing.TB, nc *nats.Conn) *tracker {
	tr := &tracker{sent: map[string]time.Time{}, routed: map[string]time.Time{}, assigned: map[string]time.Time{}, final: map[string]cp.JobEvent{},
		finals: map[string]int{}, tokens: map[string]int{}, changed: make(chan struct{}, 1)}
	ev, err := nc.Subscribe(cp.ClientAllJobEvents(cp.ClientName(nc)), func(m *nats.Msg) {
		at := time.Now()
		var e cp.JobEvent
		if _, err := cp.DecodeMsg(m, &e); err != nil {
			return
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if e.State == cp.StateRouted && tr.routed[e.JobID].IsZero() {
			tr.routed[e.JobID] = at
		}
		if e.State == cp.StatePrefilling && tr.assigned[e.JobID].IsZero() {
			tr.assigned[e.JobID] = at
		}
		if e.State.Final() {
			tr.final[e.JobID] = e
			tr.finals[e.JobID]++
			select {
			case tr.changed <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := nc.Subscribe(cp.ClientAllJobTokens(cp.ClientName(nc)), func(m *nats.Msg) {
		var tm cp.TokenMsg
		if _, err := cp.DecodeMsg(m, &tm); err == nil {
			tr.mu.Lock()
			tr.tokens[tm.JobID]++
			tr.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*nats.Subscription{ev, tok} {
		_ = s.SetPendingLimits(-1, -1)
	}
	tr.subs = []*nats.Subscription{ev, tok}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return tr
}

func (tr *tracker) close() {
	for _, s := range tr.subs {
		_ = s.Unsubscribe()
	}
}

// submit sends one job with a known id (an idempotency key) and records
// when it was sent.
func (tr *tracker) submit(ctx context.Context, nc *nats.Conn, key string, req cp.SubmitRequest) (string, error) {
	req.IdempotencyKey = key
	id := cp.JobIDForKey(cp.ClientName(nc), key)
	tr.mu.Lock()
	tr.sent[id] = time.Now()
	tr.mu.Unlock()
	rep, err := cp.Submit(ctx, nc, &req)
	if err != nil {
		return "", err
	}
	if rep.JobID != id {
		return "", fmt.Errorf("job id %s, want %s", rep.JobID, id)
	}
	return id, nil
}

// waitFinal waits until every job in ids has a final event.
func (tr *tracker) waitFinal(ctx context.Context, ids []string) error {
	for {
		tr.mu.Lock()
		n := 0
		for _, id := range ids {
			if tr.finals[id] > 0 {
				n++
			}
		}
		tr.mu.Unlock()
		if n == len(ids) {
			return nil
		}
		select {
		case <-tr.changed:
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%d of %d jobs ended: %w", n, len(ids), ctx.Err())
		}
	}
}

// since returns, sorted, the time from sending each job of ids to the
// moment recorded in at (routed or assigned).
func (tr *tracker) since(ids []string, at map[string]time.Time) []time.Duration {
	return tr.between(ids, tr.sent, at)
}

// between returns, sorted, the time from each job's moment in from to its
// moment in to.
func (tr *tracker) between(ids []string, from, to map[string]time.Time) []time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []time.Duration
	for _, id := range ids {
		if a, b := from[id], to[id]; !a.IsZero() && !b.IsZero() {
			out = append(out, b.Sub(a))
		}
	}
	slices.Sort(out)
	return out
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// TestThousandJobs: 1,000 small jobs submitted at once all finish, none
// lost and none run twice, each with all its tokens. The submit-to-
// assignment overhead is logged (under load: every job queues behind the
// others; BenchmarkSubmitToAssign measures it unloaded).
func TestThousandJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 jobs take about 10 s on 2 cores")
	}
	const jobs, maxTokens = 1000, 2
	opt := testOptions(t)
	opt.Coordinator.StallTimeout = time.Minute
	opt.Queue.AckWait = 30 * time.Second
	c := startCluster(t, opt)
	nc := connect(t, c)
	tr := track(t, nc)
	defer tr.close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	start := time.Now()
	ids := make([]string, jobs)
	errs := make(chan error, jobs)
	var wg sync.WaitGroup
	for i := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := tr.submit(ctx, nc, fmt.Sprintf("load-%d-%d", start.UnixNano(), i),
				cp.SubmitRequest{TokenIDs: testkit.Prompt(4, c.Model.VocabSize, i), Sampling: cp.Sampling{MaxTokens: maxTokens}, Policy: cp.PolicyLocal})
			ids[i] = id
			if err != nil {
				errs <- fmt.Errorf("job %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	submitted := time.Since(start)
	if err := tr.waitFinal(ctx, ids); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	// Nothing can run again once every delivery is acknowledged, and by
	// then every event and token of what ran has reached nc.
	waitSettled(ctx, t, c, nc)
	tr.mu.Lock()
	for _, id := range ids {
		if f := tr.final[id]; f.State != cp.StateDone || tr.finals[id] != 1 {
			t.Errorf("job %s: %d final events, last %s %v", id, tr.finals[id], f.State, f.Error)
		}
		if tr.tokens[id] != maxTokens+1 {
			t.Errorf("job %s: %d token messages, want %d", id, tr.tokens[id], maxTokens+1)
		}
	}
	tr.mu.Unlock()
	r, a := tr.since(ids, tr.routed), tr.since(ids, tr.assigned)
	rt := tr.between(ids, tr.routed, tr.assigned)
	t.Logf("%d jobs: submitted in %v, all done in %v (%.0f jobs/s); under this load, submit to routed p50 %v p99 %v, to assignment accepted p50 %v p99 %v; assignment round trip p50 %v p99 %v max %v",
		jobs, submitted.Round(time.Millisecond), took.Round(time.Millisecond), float64(jobs)/took.Seconds(),
		quantile(r, 0.5).Round(time.Microsecond), quantile(r, 0.99).Round(time.Microsecond),
		quantile(a, 0.5).Round(time.Microsecond), quantile(a, 0.99).Round(time.Microsecond),
		quantile(rt, 0.5).Round(time.Millisecond), quantile(rt, 0.99).Round(time.Millisecond), quantile(rt, 1).Round(time.Millisecond))
}

// BenchmarkSubmitToAssign measures the control plane's overhead for one
// job on an idle cluster with the embedded server, as a client sees it:
// from sending the submission to the job's routed event (the submit
// request, the queue's store and delivery, the registry lookup and the
// routing decision: the assignment goes out at that moment), and to its
// prefilling event (the assignment accepted: add the round trip to the
// decode group's rank 0 and its admission around the ring). It reports
// p50 and p99 in ms, and the routed p99's ratio to a JetStream publish
// round trip measured in the same run (the floor of any durable
// submission).
//
//	go test -run '^$' -bench SubmitToAssign -benchtime 1000x ./coordinator/service
func BenchmarkSubmitToAssign(b *testing.B) {
	opt := testOptions(b)
	opt.Log = nil
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, opt)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	nc, err := c.Connect(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	tr := track(b, nc)
	defer tr.close()
	floor := jetStreamRoundTrip(b, nc, 200)

	ids := make([]string, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		id, err := tr.submit(ctx, nc, fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i),
			cp.SubmitRequest{TokenIDs: testkit.Prompt(4, c.Model.VocabSize, i), Sampling: cp.Sampling{MaxTokens: 1}, Policy: cp.PolicyLocal})
		if err != nil {
			b.Fatal(err)
		}
		if err := tr.waitFinal(ctx, []string{id}); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	r, a := tr.since(ids, tr.routed), tr.since(ids, tr.assigned)
	b.ReportMetric(ms(quantile(r, 0.5)), "routed-p50-ms")
	b.ReportMetric(ms(quantile(r, 0.99)), "routed-p99-ms")
	b.ReportMetric(ms(quantile(a, 0.5)), "accepted-p50-ms")
	b.ReportMetric(ms(quantile(a, 0.99)), "accepted-p99-ms")
	b.ReportMetric(ms(floor), "js-publish-ms")
	b.ReportMetric(float64(quantile(r, 0.99))/float64(floor), "routed-p99/js-publish")
}

// jetStreamRoundTrip is the median of n publishes to a JetStream stream,
// each waiting for the server's store acknowledgement.
func jetStreamRoundTrip(b *testing.B, nc *nats.Conn, n int) time.Duration {
	js, err := nc.JetStream()
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "BENCH_FLOOR", Subjects: []string{"bench.floor"}, Storage: nats.MemoryStorage}); err != nil {
		b.Fatal(err)
	}
	d := make([]time.Duration, n)
	for i := range d {
		t0 := time.Now()
		if _, err := js.Publish("bench.floor", []byte("x")); err != nil {
			b.Fatal(err)
		}
		d[i] = time.Since(t0)
	}
	slices.Sort(d)
	return d[n/2]
}
