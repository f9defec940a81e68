package controlplane

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func worker(id string, kind WorkerKind) *WorkerInfo {
	w := &WorkerInfo{ID: id, Kind: kind, Backend: "cpu", MemoryTotal: 64 << 30, MemoryFree: 32 << 30, Started: time.Now(), Time: time.Now()}
	if kind == KindDecode {
		w.GroupID, w.GroupSize, w.Layers = "g", 2, LayerRange{0, 7}
	}
	return w
}

func openRegistry(t testing.TB, srv testServer, ttl time.Duration) *Registry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := OpenRegistry(ctx, connect(t, Options{URL: srv.url}), RegistryConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// nextChange reads the next change, failing after within.
func nextChange(t testing.TB, ch <-chan WorkerChange, within time.Duration) WorkerChange {
	t.Helper()
	select {
	case c, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return c
	case <-time.After(within):
		t.Fatalf("no registry change within %v", within)
	}
	return WorkerChange{}
}

// Heartbeats register workers; a worker that stops beating expires within
// about one TTL and watchers are told; one that leaves is gone at once.
func TestRegistryHeartbeatsAndExpiry(t *testing.T) {
	serverKinds(t, security{}, func(t *testing.T, srv testServer) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		// A TTL of 2 s with beats every TTL/4 leaves 1.5 s of slack for a
		// heartbeat goroutine delayed by a loaded CI machine.
		const ttl = 2 * time.Second
		reg := openRegistry(t, srv, ttl)
		if err := reg.Put(ctx, worker("pre-existing", KindPrefill)); err != nil {
			t.Fatal(err)
		}
		watch, err := reg.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c := nextChange(t, watch, 5*time.Second); c.Op != WorkerUp || c.ID != "pre-existing" {
			t.Fatalf("first change %+v, want the registered worker up", c)
		}
		if c := nextChange(t, watch, 5*time.Second); c.Op != WorkerSynced {
			t.Fatalf("second change %+v, want synced", c)
		}

		// "beating" keeps beating; "silent" beats once; "leaving" leaves.
		other := openRegistry(t, srv, ttl) // workers use their own connections
		beating, silent, leaving := worker("beating", KindDecode), worker("silent", KindPrefill), worker("leaving", KindPrefill)
		for _, w := range []*WorkerInfo{beating, silent, leaving} {
			if err := other.Put(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		lastBeat := time.Now() // silent's only heartbeat
		stopBeat := make(chan struct{})
		beatDone := make(chan struct{})
		go func() {
			defer close(beatDone)
			tick := time.NewTicker(ttl / 4)
			defer tick.Stop()
			for {
				select {
				case <-stopBeat:
					return
				case <-tick.C:
					b := *beating
					b.Time, b.QueueDepth = time.Now(), b.QueueDepth+1
					beating.QueueDepth = b.QueueDepth
					if err := other.Put(ctx, &b); err != nil {
						t.Errorf("heartbeat: %v", err)
						return
					}
				}
			}
		}()
		stopBeating := sync.OnceFunc(func() { close(stopBeat); <-beatDone })
		defer stopBeating()
		if err := other.Remove(ctx, "leaving"); err != nil {
			t.Fatal(err)
		}

		got, err := reg.Get(ctx, "beating")
		if err != nil || got.Kind != KindDecode || got.Layers != (LayerRange{0, 7}) {
			t.Fatalf("Get beating: %+v, %v", got, err)
		}
		if _, err := reg.Get(ctx, "leaving"); !errors.Is(err, ErrWorkerNotFound) {
			t.Fatalf("Get of a worker that left: %v, want ErrWorkerNotFound", err)
		}

		events := map[string][]WorkerOp{}
		expiredAt := time.Time{}
		deadline := time.Now().Add(6 * ttl)
		for expiredAt.IsZero() && time.Now().Before(deadline) {
			c := nextChange(t, watch, 6*ttl)
			events[c.ID] = append(events[c.ID], c.Op)
			if c.Op == WorkerExpired && c.ID == "silent" {
				expiredAt = time.Now()
			}
			if c.Op == WorkerExpired && c.ID == "beating" {
				t.Fatalf("worker %s expired: %v", c.ID, events[c.ID])
			}
		}
		if expiredAt.IsZero() {
			t.Fatalf("silent worker never expired; events %v", events)
		}
		if d := expiredAt.Sub(lastBeat); d < ttl || d > 3*ttl {
			t.Errorf("silent worker expired %v after its heartbeat, want between TTL and 3 TTL (%v)", d, ttl)
		}
		// The watcher may see the put and the delete, or (when both land
		// before it catches up: history 1 keeps the latest per key) only the
		// delete; either way it must learn that the worker left.
		if ops := events["leaving"]; len(ops) == 0 || ops[len(ops)-1] != WorkerLeft || len(ops) > 2 {
			t.Errorf("leaving worker's changes %v, want [up left] or [left]", ops)
		}
		if ops := events["beating"]; len(ops) < 2 {
			t.Errorf("beating worker's changes %v, want its heartbeats", ops)
		}

		// List shows the live workers with their latest heartbeat. The
		// beats stop and one more is sent just before it: a loaded machine
		// can starve the beating goroutine past the TTL, and then the
		// worker is rightly not live.
		stopBeating()
		b := *beating
		b.Time, b.QueueDepth = time.Now(), b.QueueDepth+1
		if err := other.Put(ctx, &b); err != nil {
			t.Fatal(err)
		}
		live, err := reg.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, w := range live {
			ids = append(ids, w.ID)
		}
		// pre-existing stopped beating before silent did, so it has gone too.
		if len(ids) != 1 || ids[0] != "beating" {
			t.Fatalf("live workers %v, want [beating]", ids)
		}
		if live[0].QueueDepth != b.QueueDepth {
			t.Errorf("List returned a stale heartbeat: queue depth %d, want %d", live[0].QueueDepth, b.QueueDepth)
		}
	})
}

func TestRegistryRejects(t *testing.T) {
	srv := startEmbedded(t, security{})
	ctx := context.Background()
	nc := connect(t, Options{URL: srv.url})
	if _, err := OpenRegistry(ctx, nc, RegistryConfig{TTL: 100 * time.Millisecond}); err == nil {
		t.Fatal("a 100ms TTL was accepted")
	}
	reg := openRegistry(t, srv, 2*time.Second)
	bad := worker("w", KindDecode)
	bad.GroupSize = 0
	if err := reg.Put(ctx, bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Put of an invalid worker: %v, want ErrInvalid", err)
	}
	if err := reg.Remove(ctx, "a.b"); err == nil {
		t.Fatal("Remove accepted an id with a dot")
	}
	// A foreign value in the bucket is reported, not fatal.
	if _, err := nc.Request(HeartbeatSubject("junk"), []byte("junk"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := reg.Put(ctx, worker("good", KindPrefill)); err != nil {
		t.Fatal(err)
	}
	live, err := reg.List(ctx)
	if !errors.Is(err, ErrInvalid) || len(live) != 1 || live[0].ID != "good" {
		t.Fatalf("List with a junk value: %v, %v; want [good] and an ErrInvalid error", live, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	watch, err := reg.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[WorkerOp]string{}
	for len(seen) < 3 {
		c := nextChange(t, watch, 5*time.Second)
		seen[c.Op] = c.ID
	}
	if seen[WorkerInvalid] != "junk" || seen[WorkerUp] != "good" {
		t.Fatalf("watch saw %v, want junk invalid and good up", seen)
	}
	cancel()
	for range watch { // closes once the context ends
	}
}
