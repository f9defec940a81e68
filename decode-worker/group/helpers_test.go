package group

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/model"
)

var testSecret = []byte("0123456789abcdef-transfer-secret")

// fastOpts are options for tests that wait for failures.
func fastOpts(dir string, ranks int) Options {
	return Options{ModelDir: dir, Ranks: ranks, Heartbeat: 200 * time.Millisecond, Idle: 3 * time.Second,
		Timeouts: kvtransfer.Timeouts{Handshake: 2 * time.Second, IO: 2 * time.Second, Idle: 2 * time.Second, KeepAlive: 200 * time.Millisecond}}
}

// startGroup starts a group with opt; the test closes it.
func startGroup(t *testing.T, opt Options) *Group {
	t.Helper()
	return testkit.Start(t, func() (*Group, error) { return Start(testctx.Context(t), opt) })
}

// sampled is the monolithic reference of seeded sampling: Start, then one
// decode step per token, drawing with the same sampler.
func sampled(t *testing.T, m testmodel.Reference, prompt []int32, n int, p sampling.Params) []int32 {
	t.Helper()
	ctx := context.Background()
	s, logits, err := m.Start(ctx, prompt)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := sampling.New(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []int32
	for len(out) < n {
		tok, err := sm.Sample(logits)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tok)
		l, err := m.Decode(ctx, []*model.SeqState{s}, []int32{tok})
		if err != nil {
			t.Fatal(err)
		}
		logits = l[0]
	}
	return out
}

// send moves st to the group's ranks with kvtransfer under one session,
// each layer to its stage's ranks, each tensor rank its slice.
func (g *Group) send(ctx context.Context, st *model.SeqState, session string) error {
	layers := map[int][]kvtransfer.Dest{}
	for r, s := range g.Layout.Ranks {
		for L := s.Lo; L < s.Hi; L++ {
			layers[L] = append(layers[L], kvtransfer.Dest{Endpoint: s.Endpoint, Shard: g.Layout.Shard(r)})
		}
	}
	place, err := kvtransfer.NewSharded(g.Model(0).Cfg, layers)
	if err != nil {
		return err
	}
	return kvtransfer.SendState(ctx, kvtransfer.SenderConfig{Session: session, Secret: testSecret, Placement: place,
		Deadline: time.Now().Add(20 * time.Second)}, st)
}

// remote is a Request.Remote for a state of tokens tokens under one session.
func (g *Group) remote(session string, tokens int) *pipeline.Remote {
	rm := &pipeline.Remote{Tokens: tokens, Deadline: time.Now().Add(20 * time.Second)}
	for range g.Layout.Ranks {
		rm.Sessions = append(rm.Sessions, pipeline.Session{ID: session, Secret: testSecret})
	}
	return rm
}

// checkFreed waits until no rank holds a sequence or reserved bytes.
func (g *Group) checkFreed(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r := range g.Layout.Ranks {
		for {
			st := g.Worker(r).Stats()
			if st.Sequences == 0 && st.ReservedBytes == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d still holds %d sequences, %d bytes", r, st.Sequences, st.ReservedBytes)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if st := g.Server(r).Stats(); st.HeldBytes != 0 || st.Sessions != 0 {
			t.Fatalf("rank %d's kvtransfer server holds %d bytes, %d sessions", r, st.HeldBytes, st.Sessions)
		}
	}
}

func waitTokens(t *testing.T, c *Collector, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(c.Tokens(id)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("sequence %s: %d tokens after 20 s, waiting for %d", id, len(c.Tokens(id)), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func name(f string, args ...any) string { return fmt.Sprintf(f, args...) }

func nanF() float64 { return math.NaN() }
