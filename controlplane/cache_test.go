package controlplane

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestCacheSubjectsAreTheOperators: over the embedded server and a real
// nats-server configured by ServerAuthorization, a worker serves its cache
// subject and the coordinator's requests reach it, while a client's and a
// worker's (a named one, another worker's cache; the shared one) are
// refused by the server and never reach the handler: none may list what a
// worker cached (what was prompted) or empty it.
func TestCacheSubjectsAreTheOperators(t *testing.T) {
	ids := append(NewIdentities(), NewIdentity(PrincipalWorker, "w1"), NewIdentity(PrincipalWorker, "w2"))
	onBothServers(t, ids, func(t *testing.T, ctx context.Context, url string) {
		w1 := connect(t, Options{URL: url, Identity: &ids[3]})
		var reached atomic.Int32
		if _, err := Serve(ctx, w1, WorkerCache("w1"), "", func(_ context.Context, req *CacheRequest) (*CacheReply, error) {
			reached.Add(1)
			return &CacheReply{WorkerID: req.WorkerID, Kind: KindPrefill, Off: true}, nil
		}); err != nil {
			t.Fatal(err)
		}
		coord := connect(t, Options{URL: url, Identity: Find(ids, PrincipalCoordinator)})
		if rep, err := ListCache(ctx, coord, "w1"); err != nil || !rep.Off || rep.WorkerID != "w1" {
			t.Fatalf("the coordinator's list: %+v, %v", rep, err)
		}
		for _, who := range []*Identity{&ids[2], &ids[4], &ids[1]} {
			nc := connect(t, Options{URL: url, Identity: who})
			violations := make(chan string, 4)
			nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
					violations <- err.Error()
				}
			})
			// A request (with a reply inbox) as DropCache sends it;
			// the refusal, not a timeout, is what it gets.
			m, err := NewMsg(WorkerCache("w1"), MsgPack, &CacheRequest{WorkerID: "w1", Op: CacheDrop, All: true})
			if err != nil {
				t.Fatal(err)
			}
			m.Reply = nc.NewRespInbox()
			if err := nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
			expectViolation(t, violations, WorkerCache("w1"))
		}
		// The refusals came back after the server dropped the
		// requests; the coordinator's next request is the handler's
		// second.
		if _, err := DropCache(ctx, coord, "w1", "k-1"); err != nil {
			t.Fatal(err)
		}
		if n := reached.Load(); n != 2 {
			t.Fatalf("the worker's handler ran %d times, want the coordinator's 2 requests only", n)
		}
	})
}
