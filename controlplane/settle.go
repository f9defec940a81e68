package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// settleLimit bounds how long creating a stream or bucket waits for a
// clustered JetStream to elect its leaders: a few election timeouts of
// nats-server's raft (4-9 s each).
const settleLimit = 45 * time.Second

// whileJetStreamSettles runs op until it succeeds, fails for a reason other
// than a JetStream that is still electing its leaders (503, "temporarily
// unavailable", or a request nobody answered in time: the servers of a
// cluster that start together), ctx ends or settleLimit passes.
func whileJetStreamSettles(ctx context.Context, op func(context.Context) error) error {
	limit := time.Now().Add(settleLimit)
	pause := 100 * time.Millisecond
	for {
		err := op(ctx)
		if err == nil || !unsettled(ctx, err) || time.Now().Add(pause).After(limit) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (waiting for JetStream to elect its leaders: %w)", err, ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// unsettled reports whether err is JetStream not having a leader yet.
func unsettled(ctx context.Context, err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.Code == http.StatusServiceUnavailable
	}
	// A request of its own that timed out, not the caller's ctx.
	return ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}
