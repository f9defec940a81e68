package controlplane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func testJob(t testing.TB, key string) *QueuedJob {
	t.Helper()
	req := SubmitRequest{TokenIDs: []int32{1, 2, 3}, Sampling: Sampling{MaxTokens: 4}, IdempotencyKey: key}
	return &QueuedJob{JobID: JobIDFor(DefaultClient, &req), Submitted: time.Now(), Request: req, Client: DefaultClient}
}

func openQueue(t testing.TB, nc *nats.Conn, cfg QueueConfig) *JobQueue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := OpenJobQueue(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func nextJob(t testing.TB, q *JobQueue, within time.Duration) *Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	d, err := q.Next(ctx)
	if err != nil {
		t.Fatalf("next job: %v", err)
	}
	return d
}

func ack(t testing.TB, d *Delivery) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// expectEmpty asserts that nothing is delivered within wait and nothing is
// stored.
func expectEmpty(t testing.TB, q *JobQueue, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if d, err := q.Next(ctx); err == nil {
		t.Fatalf("job %s delivered (delivery %d); want none", d.Job.JobID, d.NumDelivered)
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next: %v, want the deadline", err)
	}
	st, err := q.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Stored != 0 || st.InFlight != 0 || st.Waiting != 0 {
		t.Fatalf("queue stats %+v, want empty", st)
	}
}

func TestJobQueueDedupesByIdempotencyKey(t *testing.T) {
	serverKinds(t, security{}, func(t *testing.T, srv testServer) {
		ctx := context.Background()
		q := openQueue(t, connect(t, Options{URL: srv.url}), QueueConfig{})
		first := testJob(t, "client-42/attempt")
		retry := testJob(t, "client-42/attempt")
		if first.JobID != retry.JobID {
			t.Fatalf("same key gave job ids %s and %s", first.JobID, retry.JobID)
		}
		r1, err := q.Enqueue(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := q.Enqueue(ctx, retry)
		if err != nil {
			t.Fatal(err)
		}
		if r1.Duplicate || !r2.Duplicate || r2.Seq != r1.Seq {
			t.Fatalf("enqueue results %+v then %+v; want the second a duplicate of the first", r1, r2)
		}
		other, err := q.Enqueue(ctx, testJob(t, "another-key"))
		if err != nil || other.Duplicate {
			t.Fatalf("a new key: %+v, %v; want a new job", other, err)
		}
		st, err := q.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Stored != 2 {
			t.Fatalf("%d jobs stored, want 2", st.Stored)
		}
		for range 2 {
			ack(t, nextJob(t, q, 5*time.Second))
		}
		expectEmpty(t, q, 300*time.Millisecond)
	})
}

// A coordinator that dies holding a job (no ack) loses nothing: once the ack
// wait passes, the job is delivered to whoever consumes next, and a job
// acknowledged is never delivered again.
func TestJobQueueRedeliversAfterConsumerRestart(t *testing.T) {
	serverKinds(t, security{}, func(t *testing.T, srv testServer) {
		ctx := context.Background()
		cfg := QueueConfig{AckWait: time.Second}
		crashed := connect(t, Options{URL: srv.url})
		q := openQueue(t, crashed, cfg)
		held, waiting := testJob(t, ""), testJob(t, "")
		for _, j := range []*QueuedJob{held, waiting} {
			if _, err := q.Enqueue(ctx, j); err != nil {
				t.Fatal(err)
			}
		}
		d := nextJob(t, q, 5*time.Second)
		if d.Job.JobID != held.JobID || d.Redelivered() {
			t.Fatalf("first delivery: job %s (delivery %d), want %s (1)", d.Job.JobID, d.NumDelivered, held.JobID)
		}
		crashed.Close() // the coordinator dies without acking

		q2 := openQueue(t, connect(t, Options{URL: srv.url}), cfg)
		seen := map[string]*Delivery{}
		for len(seen) < 2 {
			d := nextJob(t, q2, 10*time.Second)
			if _, dup := seen[d.Job.JobID]; dup {
				t.Fatalf("job %s delivered twice to the restarted coordinator", d.Job.JobID)
			}
			seen[d.Job.JobID] = d
		}
		if d := seen[held.JobID]; d == nil || !d.Redelivered() || d.NumDelivered != 2 {
			t.Fatalf("held job after restart: %+v, want delivery 2", d)
		}
		if d := seen[waiting.JobID]; d == nil || d.Redelivered() {
			t.Fatalf("waiting job after restart: %+v, want delivery 1", d)
		}
		for _, d := range seen {
			ack(t, d)
		}
		// Acked jobs are gone from the work queue (DoubleAck waited for the
		// server), so they cannot come back.
		expectEmpty(t, q2, 300*time.Millisecond)
	})
}

// A long job kept alive with in-progress acks is not handed to another
// coordinator, however long past the ack wait it runs.
func TestJobQueueKeepAliveHoldsLongJob(t *testing.T) {
	serverKinds(t, security{}, func(t *testing.T, srv testServer) {
		ctx := context.Background()
		cfg := QueueConfig{AckWait: time.Second}
		q := openQueue(t, connect(t, Options{URL: srv.url}), cfg)
		other := openQueue(t, connect(t, Options{URL: srv.url}), cfg)
		if _, err := q.Enqueue(ctx, testJob(t, "")); err != nil {
			t.Fatal(err)
		}
		d := nextJob(t, q, 5*time.Second)
		stop := d.KeepAlive()
		defer stop()
		wait, cancel := context.WithTimeout(ctx, 2*time.Second) // twice the ack wait
		defer cancel()
		if d2, err := other.Next(wait); err == nil {
			t.Fatalf("job %s redelivered (delivery %d) while kept alive", d2.Job.JobID, d2.NumDelivered)
		}
		stop()
		ack(t, d)
		if err := d.Ack(ctx); err == nil {
			t.Fatal("second Ack of one delivery succeeded")
		}
		expectEmpty(t, other, 200*time.Millisecond)
	})
}

func TestJobQueueReleaseAndLastAttempt(t *testing.T) {
	srv := startEmbedded(t, security{})
	q := openQueue(t, connect(t, Options{URL: srv.url}), QueueConfig{MaxDeliver: 2, Memory: true})
	job := testJob(t, "")
	if _, err := q.Enqueue(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	d := nextJob(t, q, 5*time.Second)
	if d.LastAttempt() {
		t.Fatal("first of two deliveries reported as the last")
	}
	if err := d.Release(0); err != nil {
		t.Fatal(err)
	}
	d = nextJob(t, q, 5*time.Second) // immediately: no ack wait
	if d.Job.JobID != job.JobID || d.NumDelivered != 2 || !d.LastAttempt() {
		t.Fatalf("after release: job %s delivery %d last %v; want %s, 2, true", d.Job.JobID, d.NumDelivered, d.LastAttempt(), job.JobID)
	}
	ack(t, d)
	expectEmpty(t, q, 200*time.Millisecond)
}

// Something other than the coordinator published junk on the queue subject:
// it is reported once and dropped, and the queue goes on.
func TestJobQueueTerminatesUndecodableMessages(t *testing.T) {
	srv := startEmbedded(t, security{})
	nc := connect(t, Options{URL: srv.url})
	q := openQueue(t, nc, QueueConfig{Memory: true})
	if err := nc.Publish(SubjectJobQueue, []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	job := testJob(t, "")
	if _, err := q.Enqueue(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := q.Next(ctx); !errors.Is(err, ErrInvalid) {
		t.Fatalf("junk message: %v, want an ErrInvalid error", err)
	}
	d := nextJob(t, q, 5*time.Second)
	if d.Job.JobID != job.JobID {
		t.Fatalf("got %s, want %s", d.Job.JobID, job.JobID)
	}
	ack(t, d)
	expectEmpty(t, q, 200*time.Millisecond)
}

func TestJobQueueRefusesWhenFull(t *testing.T) {
	srv := startEmbedded(t, security{})
	q := openQueue(t, connect(t, Options{URL: srv.url}), QueueConfig{MaxJobs: 2, Memory: true})
	ctx := context.Background()
	for range 2 {
		if _, err := q.Enqueue(ctx, testJob(t, "")); err != nil {
			t.Fatal(err)
		}
	}
	_, err := q.Enqueue(ctx, testJob(t, ""))
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeUnavailable {
		t.Fatalf("third job into a 2-job queue: %v, want an unavailable error", err)
	}
	t.Logf("refusal: %v", err)
}

func TestJobQueueEnqueueValidates(t *testing.T) {
	srv := startEmbedded(t, security{})
	q := openQueue(t, connect(t, Options{URL: srv.url}), QueueConfig{Memory: true})
	bad := testJob(t, "")
	bad.Request.TokenIDs = nil
	if _, err := q.Enqueue(context.Background(), bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("enqueue of a job without a prompt: %v, want ErrInvalid", err)
	}
}
