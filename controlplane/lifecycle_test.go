package controlplane

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestLifecycle: a job admitted before a drain is waited for, one offered
// after it is refused saying why, the drain is announced once (Draining
// closed, one beat per request) and a drain request addressed to another
// worker is refused; Close refuses jobs as shutting down.
func TestLifecycle(t *testing.T) {
	var beats, running int
	l := NewLifecycle("w-1", "prefill worker", func() int { return running }, zap.NewNop())
	// Until it has registered, the worker takes no job (it serves first)
	// and has no heartbeat to send.
	if err := l.Admit(); err == nil || !strings.Contains(err.Error(), "not registered yet") || l.Leaving() {
		t.Fatalf("a job offered before the worker registered: %v", err)
	}
	l.Beat()
	l.Registered(func() { beats++ })
	if err := l.NotReady(); err != nil || l.Leaving() || beats != 0 {
		t.Fatalf("a registered worker is not ready: %v (%d beats)", err, beats)
	}
	if err := l.Admit(); err != nil {
		t.Fatal(err)
	}
	running = 1
	rep, err := l.DrainRequest(context.Background(), &DrainRequest{WorkerID: "w-2"})
	if err != nil || rep.Err() == nil || !strings.Contains(rep.Error, "addressed to w-2") || rep.Code != CodeBadRequest {
		t.Fatalf("a drain request for another worker: %+v %v", rep, err)
	}
	select {
	case <-l.Draining():
		t.Fatal("draining after a refused request")
	default:
	}
	rep, err = l.DrainRequest(context.Background(), &DrainRequest{WorkerID: "w-1", Reason: "test"})
	if err != nil || rep.Err() != nil || rep.Running != 1 || rep.WorkerID != "w-1" {
		t.Fatalf("drain reply %+v %v", rep, err)
	}
	<-l.Draining()
	if !l.Leaving() || beats != 1 {
		t.Fatalf("leaving %v, %d beats", l.Leaving(), beats)
	}
	if err := l.Admit(); err == nil || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("a job offered while draining: %v", err)
	}
	// The job admitted before the drain is waited for.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a job running: %v", err)
	}
	l.Done()
	if err := l.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.StartDrain("again") // beats again, changes nothing
	if beats != 2 {
		t.Fatalf("%d beats", beats)
	}
	l.Close()
	if err := l.NotReady(); err == nil || err.Error() != "shutting down" {
		t.Fatalf("closed: %v", err)
	}
}
