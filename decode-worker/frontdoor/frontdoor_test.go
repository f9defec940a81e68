package frontdoor

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kvtransfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var secret = []byte("frontdoor-test-secret-0123456789")

// serve starts a group of two and its front doors; it returns a client of
// rank 0 and one of rank 1.
func serve(t *testing.T, budget int64) (*group.Group, *Client, *Client) {
	t.Helper()
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := group.Start(ctx, group.Options{ModelDir: dir, Ranks: 2, Secret: secret, MemoryBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			Serve(sctx, g.Server(r), "local", secret, g.Worker(r), nil)
		}()
	}
	var cls []*Client
	for r := 0; r < 2; r++ {
		c, err := Dial(ctx, g.Layout.Ranks[r].Endpoint, "local", secret, kvtransfer.Timeouts{})
		if err != nil {
			t.Fatal(err)
		}
		cls = append(cls, c)
	}
	t.Cleanup(func() {
		for _, c := range cls {
			c.Close()
		}
		stop()
		wg.Wait()
		g.Close()
	})
	return g, cls[0], cls[1]
}

func TestClientRoundTrip(t *testing.T) {
	g, head, rank1 := serve(t, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := []int32{5, 17, 200, 9}
	want, err := g.Generate(ctx, "ref", p, 10)
	if err != nil {
		t.Fatal(err)
	}
	s, err := head.Submit(ctx, Request{ID: "a", Tokens: p, MaxTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	got, res, err := s.Wait(ctx)
	if err != nil || res.Reason != pipeline.ReasonLength || res.Tokens != 10 || !slices.Equal(got, want) {
		t.Fatalf("%v %+v %v, want %v", got, res, err, want)
	}

	// Seeded sampling goes through the wire unchanged.
	a, err := head.Submit(ctx, Request{ID: "t1", Tokens: p, MaxTokens: 10, Temperature: 0.9, TopK: 30, TopP: 0.9, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	ga, _, _ := a.Wait(ctx)
	if _, err := a.WaitTokens(ctx, len(ga)+1); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Fatalf("waiting for more tokens than an ended sequence has: %v", err)
	}
	b, err := head.Submit(ctx, Request{ID: "t2", Tokens: p, MaxTokens: 10, Temperature: 0.9, TopK: 30, TopP: 0.9, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	if gb, _, _ := b.Wait(ctx); !slices.Equal(ga, gb) || slices.Equal(ga, want) {
		t.Fatalf("seeded sampling: %v and %v (greedy %v)", ga, gb, want)
	}

	// Refusals carry the rank and reason.
	_, err = head.Submit(ctx, Request{ID: "big", Tokens: p, MaxTokens: 50000})
	var re *RefusedError
	if !errors.As(err, &re) || re.Rank < 0 {
		t.Fatalf("oversized: %v", err)
	}
	if _, err := rank1.Submit(ctx, Request{ID: "x", Tokens: p, MaxTokens: 1}); err == nil {
		t.Fatal("rank 1 took a submission")
	}

	// Cancel through the client.
	s, err = head.Submit(ctx, Request{ID: "long", Tokens: p, MaxTokens: 3000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitTokens(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := head.Cancel(ctx, "long"); err != nil {
		t.Fatal(err)
	}
	if _, res, _ := s.Wait(ctx); res.Reason != pipeline.ReasonCancelled {
		t.Fatalf("cancel: %+v", res)
	}
	st, err := rank1.Stats(ctx)
	if err != nil || st.Rank != 1 || st.Steps == 0 || st.Goroutines == 0 {
		t.Fatalf("rank 1 stats: %+v %v", st, err)
	}
}

// TestClientGone: a client that disconnects has its sequences cancelled.
func TestClientGone(t *testing.T) {
	g, head, _ := serve(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := head.Submit(ctx, Request{ID: "orphan", Tokens: []int32{1, 2, 3}, MaxTokens: 100000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitTokens(ctx, 2); err != nil {
		t.Fatal(err)
	}
	head.Close()
	if _, res, _ := s.Wait(ctx); res.Reason != pipeline.ReasonError {
		t.Fatalf("the stream of a closed client: %+v", res)
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.Head().Stats().Sequences != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the closed client's sequence still runs")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := g.Head().Stats(); st.Finished == 0 {
		t.Fatalf("stats: %+v", st)
	}
}

func TestDialWrongSecret(t *testing.T) {
	g, _, _ := serve(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := Dial(ctx, g.Layout.Ranks[0].Endpoint, "local", []byte("not-the-secret-0123456"), kvtransfer.Timeouts{}); err == nil {
		t.Fatal("dialed with a wrong secret")
	}
}
