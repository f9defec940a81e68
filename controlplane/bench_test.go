package controlplane

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// BenchmarkSubmitRoundTrip measures submit request -> reply on the embedded
// server, over loopback, one request at a time:
//
//	raw:     an empty NATS request-reply (the floor, measured in the same run)
//	reply:   SubmitRequest -> Serve (decode, validate) -> SubmitReply
//	enqueue: the same, the handler storing the job in the JetStream queue
//	         (file storage) first, as the coordinator will
//
// Each reports p50-us and p99-us, and x-raw: its p50 over raw's p50.
func BenchmarkSubmitRoundTrip(b *testing.B) {
	srv := startEmbedded(b, security{})
	nc := connect(b, Options{URL: srv.url})
	client := connect(b, Options{URL: srv.url})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q := openQueue(b, nc, QueueConfig{Stream: "BENCH", Subject: "tandem.v1.bench.queue", Consumer: "bench"})
	if _, err := nc.Subscribe("tandem.v1.bench.raw", func(m *nats.Msg) { _ = m.Respond(nil) }); err != nil {
		b.Fatal(err)
	}
	if _, err := Serve(ctx, nc, ClientSubmit(DefaultClient), "", func(_ context.Context, req *SubmitRequest) (*SubmitReply, error) {
		return &SubmitReply{JobID: JobIDFor(DefaultClient, req)}, nil
	}); err != nil {
		b.Fatal(err)
	}
	if _, err := Serve(ctx, nc, "tandem.v1.bench.enqueue", "", func(ctx context.Context, req *SubmitRequest) (*SubmitReply, error) {
		job := &QueuedJob{JobID: JobIDFor(DefaultClient, req), Submitted: time.Now(), Request: *req, Client: DefaultClient}
		if _, err := q.Enqueue(ctx, job); err != nil {
			return nil, err
		}
		return &SubmitReply{JobID: job.JobID}, nil
	}); err != nil {
		b.Fatal(err)
	}
	req := &SubmitRequest{TokenIDs: make([]int32, 64), Sampling: Sampling{MaxTokens: 32, Temperature: 0.7}}

	var rawP50 time.Duration
	b.Run("raw", func(b *testing.B) {
		rawP50 = measure(b, 0, func() error {
			_, err := client.Request("tandem.v1.bench.raw", nil, 5*time.Second)
			return err
		})
	})
	for _, subject := range []string{ClientSubmit(DefaultClient), "tandem.v1.bench.enqueue"} {
		name := map[string]string{ClientSubmit(DefaultClient): "reply", "tandem.v1.bench.enqueue": "enqueue"}[subject]
		b.Run(name, func(b *testing.B) {
			measure(b, rawP50, func() error {
				var rep SubmitReply
				if err := Request(ctx, client, subject, req, &rep); err != nil {
					return err
				}
				return rep.Err()
			})
		})
	}
}

// measure times each call and reports p50 and p99 (and p50 over base's).
func measure(b *testing.B, base time.Duration, call func() error) time.Duration {
	var lat []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t := time.Now()
		if err := call(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	b.ReportMetric(float64(p50.Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(p99.Nanoseconds())/1e3, "p99-us")
	if base > 0 {
		b.ReportMetric(float64(p50)/float64(base), "x-raw")
	}
	return p50
}
