package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
)

// queueCounts is the job queue as its consumer sees it: jobs stored and not
// yet delivered, and jobs delivered to a coordinator and not acknowledged.
type queueCounts struct {
	Waiting  uint64
	InFlight int
}

// readQueue reads the job queue's counters from the server (the default
// stream and consumer, as testOptions configure them); nc must be allowed
// the JetStream API (the coordinator's identity).
func readQueue(ctx context.Context, nc *nats.Conn) (queueCounts, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return queueCounts{}, err
	}
	c, err := js.Consumer(ctx, cp.JobsStream, cp.JobsConsumer)
	if err != nil {
		return queueCounts{}, err
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return queueCounts{}, err
	}
	return queueCounts{Waiting: ci.NumPending, InFlight: ci.NumAckPending}, nil
}

// waitQueue polls the job queue of c until it holds exactly want (within
// ctx), reading it as the coordinator.
func waitQueue(ctx context.Context, t *testing.T, c *cluster.Cluster, want queueCounts) {
	t.Helper()
	nc, err := c.ConnectAs(ctx, cp.PrincipalCoordinator, "test-queue-reader")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var got queueCounts
	for {
		if got, err = readQueue(ctx, nc); err == nil && got == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job queue %+v (last error %v), waiting for %+v", got, err, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitSettled waits for the sign that no job of c can run again and that
// every message of the jobs that ran has reached nc: the queue holds no
// job, waiting or delivered (each delivery acknowledged, so none can come
// back), then a round trip from nc to the server. A coordinator
// acknowledges a job only after publishing its final event, and rank 0
// publishes a job's tokens before reporting it done, so the server had
// every such message before the acknowledgement; it sends them to nc
// before the answer to nc's ping.
func waitSettled(ctx context.Context, t *testing.T, c *cluster.Cluster, nc *nats.Conn) {
	t.Helper()
	waitQueue(ctx, t, c, queueCounts{})
	if err := nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
}
