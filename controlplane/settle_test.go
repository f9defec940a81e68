package controlplane

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A JetStream cluster that is electing its leaders answers 503: creating a
// stream waits that out; any other error is returned at once.
func TestWhileJetStreamSettles(t *testing.T) {
	electing := &jetstream.APIError{Code: http.StatusServiceUnavailable, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	calls := 0
	err := whileJetStreamSettles(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return electing
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("after %d calls: %v, want success on the third", calls, err)
	}

	bad := &jetstream.APIError{Code: http.StatusBadRequest, ErrorCode: 10058, Description: "stream name already in use"}
	calls = 0
	err = whileJetStreamSettles(context.Background(), func(context.Context) error { calls++; return bad })
	if !errors.Is(err, bad) || calls != 1 {
		t.Fatalf("after %d calls: %v, want the refusal at once", calls, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = whileJetStreamSettles(ctx, func(context.Context) error {
		calls++
		cancel()
		return electing
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, electing) || calls != 1 {
		t.Fatalf("after %d calls: %v, want the cancellation with the last error", calls, err)
	}
}
