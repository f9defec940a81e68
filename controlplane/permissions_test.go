package controlplane

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// TestWorkerIdentityCannotReconfigureBuckets: over the embedded server and
// a real nats-server with ServerAuthorization's block, a worker identity
// joins the registry the coordinator created and keeps its own key there,
// and nothing more: the server refuses it a put of another worker's key
// (named identity), and every stream or bucket change (update, delete,
// purge, create), which would let it republish clients' subjects to
// itself or drop the registry. The coordinator then finds the buckets as
// it set them up.
func TestWorkerIdentityCannotReconfigureBuckets(t *testing.T) {
	ids := append(NewIdentities(), NewIdentity(PrincipalWorker, "w1"))
	onBothServers(t, ids, func(t *testing.T, ctx context.Context, url string) {
		shared, named := &ids[1], &ids[3]

		// Before any coordinator, a worker waits for the registry.
		wnc := connect(t, Options{URL: url, Identity: shared})
		early, stop := context.WithTimeout(ctx, 300*time.Millisecond)
		waited := false
		_, err := JoinRegistry(early, wnc, "", func(error) { waited = true })
		stop()
		if err == nil || !waited || !errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Fatalf("joining a registry nobody created: %v (waited %v)", err, waited)
		}

		coord := connect(t, Options{URL: url, Identity: Find(ids, PrincipalCoordinator)})
		if _, err := OpenRegistry(ctx, coord, RegistryConfig{TTL: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenResults(ctx, coord, ResultsConfig{}); err != nil {
			t.Fatal(err)
		}
		reg, err := JoinRegistry(ctx, wnc, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if reg.TTL() != 5*time.Second {
			t.Fatalf("the worker's registry TTL %v, want the coordinator's 5s", reg.TTL())
		}
		if err := reg.Put(ctx, worker("w1", KindPrefill)); err != nil {
			t.Fatalf("a worker's heartbeat: %v", err)
		}

		// The named worker keeps its own key only.
		violations := make(chan string, 16)
		watch := func(nc *nats.Conn) {
			nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
					violations <- err.Error()
				}
			})
		}
		w1 := connect(t, Options{URL: url, Identity: named})
		watch(w1)
		r1, err := JoinRegistry(ctx, w1, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r1.Put(ctx, worker("w1", KindPrefill)); err != nil {
			t.Fatalf("a named worker's own heartbeat: %v", err)
		}
		short, stop := context.WithTimeout(ctx, 2*time.Second)
		if err := r1.Put(short, worker("w2", KindPrefill)); err == nil {
			t.Fatal("worker w1 put worker w2's registry key")
		}
		stop()
		expectViolation(t, violations, "$KV."+WorkersBucket+".w2")

		// The shared worker identity may change no stream or bucket.
		watch(wnc)
		js, err := jetstream.New(wnc)
		if err != nil {
			t.Fatal(err)
		}
		kvStream := "KV_" + WorkersBucket
		attempts := map[string]func(context.Context) error{
			// The registry's stream given the clients' subjects,
			// republished to the worker's inbox.
			"$JS.API.STREAM.UPDATE." + kvStream: func(ctx context.Context) error {
				s, err := js.Stream(ctx, kvStream)
				if err != nil {
					return err
				}
				c := s.CachedInfo().Config
				c.Subjects = append(c.Subjects, Prefix+".clients.>")
				c.RePublish = &jetstream.RePublish{Source: Prefix + ".clients.>", Destination: "_INBOX.worker.any.snoop.>"}
				_, err = js.UpdateStream(ctx, c)
				return err
			},
			"$JS.API.STREAM.DELETE." + kvStream: func(ctx context.Context) error { return js.DeleteKeyValue(ctx, WorkersBucket) },
			"$JS.API.STREAM.DELETE.KV_" + ResultsBucket: func(ctx context.Context) error {
				return js.DeleteStream(ctx, "KV_"+ResultsBucket)
			},
			"$JS.API.STREAM.CREATE.SNOOP": func(ctx context.Context) error {
				_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SNOOP", Subjects: []string{Prefix + ".clients.>"}})
				return err
			},
		}
		attempts["$JS.API.STREAM.PURGE."+kvStream] = func(ctx context.Context) error {
			s, err := js.Stream(ctx, kvStream)
			if err != nil {
				return err
			}
			return s.Purge(ctx)
		}
		var wg sync.WaitGroup
		errs := make(chan string, len(attempts))
		for subject, try := range attempts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				if err := try(actx); err == nil {
					errs <- subject + ": allowed"
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		var seen []string
		for range attempts {
			select {
			case v := <-violations:
				seen = append(seen, v)
			case <-time.After(10 * time.Second):
				t.Fatalf("refusals seen: %q; want one per attempt (%d)", seen, len(attempts))
			}
		}
		for subject := range attempts {
			if !slices.ContainsFunc(seen, func(v string) bool { return strings.Contains(v, `"`+subject+`"`) }) {
				t.Errorf("no refusal of %s among %q", subject, seen)
			}
		}

		// Everything as the coordinator set it up.
		cjs, err := jetstream.New(coord)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := cjs.KeyValue(ctx, WorkersBucket)
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Status(ctx)
		if err != nil || st.TTL() != 5*time.Second || st.Values() == 0 {
			t.Fatalf("registry after the attempts: %+v %v", st, err)
		}
		if _, err := cjs.KeyValue(ctx, ResultsBucket); err != nil {
			t.Fatalf("results bucket after the attempts: %v", err)
		}
		if s, err := cjs.Stream(ctx, "KV_"+WorkersBucket); err != nil || len(s.CachedInfo().Config.Subjects) != 1 || s.CachedInfo().Config.RePublish != nil {
			t.Fatalf("registry stream after the attempts: %v", err)
		}
		if _, err := cjs.Stream(ctx, "SNOOP"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("a worker's stream: %v", err)
		}
	})
}

func expectViolation(t *testing.T, ch <-chan string, subject string) {
	t.Helper()
	select {
	case v := <-ch:
		if !strings.Contains(v, `"`+subject+`"`) {
			t.Fatalf("refusal %q, want one of a publish to %s", v, subject)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no refusal of a publish to %s", subject)
	}
}

// TestOnlyTheCoordinatorDrains: over the embedded server and a real
// nats-server with ServerAuthorization's block, a worker's drain subject
// answers the coordinator's DrainRequest, and the server refuses a
// client's (it may not drain a worker) and another worker's, named or
// shared, which may neither publish it nor listen on a named worker's
// subject of another worker.
func TestOnlyTheCoordinatorDrains(t *testing.T) {
	ids := append(NewIdentities(), NewIdentity(PrincipalWorker, "w1"), NewIdentity(PrincipalWorker, "w2"))
	onBothServers(t, ids, func(t *testing.T, ctx context.Context, url string) {
		w1 := connect(t, Options{URL: url, Identity: Find(ids[3:], PrincipalWorker), InboxPrefix: InboxPrefix(PrincipalWorker, "w1")})
		life := NewLifecycle("w1", "prefill worker", func() int { return 0 }, zap.NewNop())
		if _, err := Serve(ctx, w1, WorkerDrain("w1"), "", life.DrainRequest); err != nil {
			t.Fatal(err)
		}
		if err := w1.Flush(); err != nil {
			t.Fatal(err)
		}

		violations := make(chan string, 16)
		intruder := func(o Options) *nats.Conn {
			nc := connect(t, o)
			nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
					violations <- err.Error()
				}
			})
			return nc
		}
		for _, x := range []struct {
			who string
			o   Options
		}{
			{"a client", Options{URL: url, Identity: Find(ids, PrincipalClient)}},
			{"the shared worker identity", Options{URL: url, Identity: Find(ids, PrincipalWorker), InboxPrefix: InboxPrefix(PrincipalWorker, "w2")}},
			{"worker w2", Options{URL: url, Identity: &ids[4], InboxPrefix: InboxPrefix(PrincipalWorker, "w2")}},
		} {
			nc := intruder(x.o)
			short, stop := context.WithTimeout(ctx, time.Second)
			rep, err := Drain(short, nc, "w1", "not yours")
			stop()
			if err == nil {
				t.Fatalf("%s drained w1: %+v", x.who, rep)
			}
			expectViolation(t, violations, WorkerDrain("w1"))
			select {
			case <-life.Draining():
				t.Fatalf("%s's drain request reached w1", x.who)
			default:
			}
		}
		// A named worker listens on its own drain subject only.
		w2 := intruder(Options{URL: url, Identity: &ids[4], InboxPrefix: InboxPrefix(PrincipalWorker, "w2")})
		if _, err := w2.SubscribeSync(WorkerDrain("w1")); err != nil {
			t.Fatal(err)
		}
		select {
		case v := <-violations:
			if !strings.Contains(strings.ToLower(v), "subscription") || !strings.Contains(v, `"`+WorkerDrain("w1")+`"`) {
				t.Fatalf("refusal %q, want the subscription to %s", v, WorkerDrain("w1"))
			}
		case <-time.After(10 * time.Second):
			t.Fatal("worker w2 subscribed to w1's drain subject")
		}

		coord := connect(t, Options{URL: url, Identity: Find(ids, PrincipalCoordinator)})
		rep, err := Drain(ctx, coord, "w1", "maintenance")
		if err != nil || rep.WorkerID != "w1" {
			t.Fatalf("the coordinator's drain: %+v %v", rep, err)
		}
		<-life.Draining()
	})
}
