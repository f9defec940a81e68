package controlplane

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestWorkerIDFrom(t *testing.T) {
	for _, c := range []struct {
		parts []string
		want  string
	}{
		{[]string{"prefill", "gpu-box.local"}, "prefill-gpu-box-local"},
		{[]string{"decode", "Mac Studio (2)"}, "decode-Mac-Studio--2"},
		{[]string{"x", strings.Repeat("a", 100)}, "x-" + strings.Repeat("a", MaxIDLen-2)},
	} {
		got, err := WorkerIDFrom(c.parts...)
		if err != nil || got != c.want {
			t.Errorf("WorkerIDFrom(%q) = %q, %v; want %q", c.parts, got, err, c.want)
		}
	}
	if id, err := WorkerIDFrom("..", "/"); err == nil {
		t.Errorf("WorkerIDFrom of punctuation only = %q, want an error", id)
	}
}

// A heartbeat registers the worker before it returns, puts fresh info on
// Beat, refuses an interval the registry's TTL would outrun, and
// deregisters the worker on Stop.
func TestHeartbeat(t *testing.T) {
	srv := startEmbedded(t, security{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg := openRegistry(t, srv, time.Minute)
	if _, err := StartHeartbeat(ctx, reg, reg.TTL(), func() WorkerInfo { return *worker("w", KindPrefill) }, nil); err == nil {
		t.Fatal("a beat every TTL was accepted; the registry would forget the worker between beats")
	}
	var free atomic.Uint64
	free.Store(1 << 30)
	info := func() WorkerInfo {
		w := worker("w1", KindPrefill)
		w.MemoryFree = free.Load()
		return *w
	}
	// The schedule (TTL/3 = 20 s) never fires within the test: every put
	// after the first is a Beat.
	hb, err := StartHeartbeat(ctx, reg, 0, info, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := reg.Get(ctx, "w1")
	if err != nil || got.MemoryFree != 1<<30 {
		t.Fatalf("registered on start: %+v, %v", got, err)
	}
	watch, err := reg.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	free.Store(2 << 30)
	hb.Beat()
	for {
		c := nextChange(t, watch, 10*time.Second)
		if c.Info != nil && c.ID == "w1" && c.Info.MemoryFree == 2<<30 {
			break
		}
	}
	if err := hb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if w, err := reg.Get(ctx, "w1"); !errors.Is(err, ErrWorkerNotFound) {
		t.Fatalf("after Stop the registry still has %+v (%v)", w, err)
	}
	if err := hb.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}
