package sink_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
)

// prefilled returns a real state: the tiny model's prefill of 70 tokens
// (crossing a KDA chunk), with the given MLA cache dtype.
func prefilled(t *testing.T, dt model.DType) *model.SeqState {
	t.Helper()
	m, err := model.Load(testmodel.Dir(t, "tiny", 1, 2), cpu.New(1), model.LoadOptions{Embed: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.State.LatentDType = dt
	toks := make([]int32, 70)
	for i := range toks {
		toks[i] = int32((i*31 + 7) % m.Cfg.VocabSize)
	}
	s := m.NewState(0, m.Cfg.NumLayers)
	if err := m.PrefillState(context.Background(), []*model.SeqState{s}, [][]int32{toks}); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFileSinkMatchesMarshal: the streamed file is byte-identical to
// MarshalBinary of the same state, and reads back.
func TestFileSinkMatchesMarshal(t *testing.T) {
	for _, dt := range []model.DType{model.BF16, model.F32} {
		s := prefilled(t, dt)
		want, err := s.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "job.k3st")
		f, err := sink.NewFile(path, len(s.Layers))
		if err != nil {
			t.Fatal(err)
		}
		for _, ls := range s.Layers {
			if err := f.PutLayer(context.Background(), ls.Clone()); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(context.Background(), s.Tokens); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: file (%d bytes) differs from MarshalBinary (%d bytes)", dt, len(got), len(want))
		}
		back, err := sink.ReadFile(path)
		if err != nil || back.Tokens != s.Tokens {
			t.Fatalf("ReadFile: %v, tokens %v", err, back)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Fatalf("leftover files: %v", ents)
		}
	}
}

func TestFileSinkOrderAndAbort(t *testing.T) {
	s := prefilled(t, model.BF16)
	dir := t.TempDir()
	path := filepath.Join(dir, "job.k3st")
	f, err := sink.NewFile(path, len(s.Layers))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := f.PutLayer(ctx, s.Layers[2]); err != nil {
		t.Fatal(err)
	}
	if err := f.PutLayer(ctx, s.Layers[1]); err == nil || !strings.Contains(err.Error(), "layer 1 after layer 2") {
		t.Fatalf("out of order put: %v", err)
	}
	f.Abort(errors.New("job cancelled"))
	if err := f.Close(ctx, 3); err == nil {
		t.Fatal("Close after Abort succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("abort left files: %v", ents)
	}
}

func TestMemorySink(t *testing.T) {
	s := prefilled(t, model.BF16)
	m := sink.NewMemory(len(s.Layers))
	ctx := context.Background()
	for _, ls := range s.Layers {
		if err := m.PutLayer(ctx, ls); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.State(); !errors.Is(err, sink.ErrNotClosed) {
		t.Fatalf("State before Close: %v", err)
	}
	if err := m.PutLayer(ctx, s.Layers[0]); err == nil {
		t.Fatal("repeated layer accepted")
	}
	if err := m.Close(ctx, s.Tokens); err != nil {
		t.Fatal(err)
	}
	got, err := m.State()
	if err != nil {
		t.Fatal(err)
	}
	a, _ := got.MarshalBinary()
	b, _ := s.MarshalBinary()
	if !bytes.Equal(a, b) {
		t.Fatal("memory sink state differs")
	}
}

// gated is a sink whose PutLayer waits for a token per layer (a stalled
// link) and honours its context.
type gated struct {
	*sink.Memory
	gate chan struct{}
	fail int // layer to refuse, -1 for none
}

func (g *gated) PutLayer(ctx context.Context, ls *model.LayerState) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	if ls.Layer == g.fail {
		return errors.New("link reset")
	}
	return g.Memory.PutLayer(ctx, ls)
}

func TestQueueBackpressure(t *testing.T) {
	s := prefilled(t, model.BF16)
	g := &gated{Memory: sink.NewMemory(len(s.Layers)), gate: make(chan struct{}), fail: -1}
	q := sink.NewQueue(g, 2)
	ctx := context.Background()
	// The drainer takes layer 0 and blocks in PutLayer; two more fill the queue.
	for L := 0; L < 3; L++ {
		if err := q.Put(ctx, s.Layers[L]); err != nil {
			t.Fatal(err)
		}
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := q.Put(tctx, s.Layers[3])
	cancel()
	if err == nil || !strings.Contains(err.Error(), "sink queue full") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("put into a full queue: %v", err)
	}
	// Release the link: everything drains and closes.
	go func() {
		for range len(s.Layers) {
			g.gate <- struct{}{}
		}
	}()
	for L := 3; L < len(s.Layers); L++ {
		if err := q.Put(ctx, s.Layers[L]); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Close(ctx, s.Tokens); err != nil {
		t.Fatal(err)
	}
	if _, err := g.State(); err != nil {
		t.Fatal(err)
	}
}

func TestQueueSinkFailureAndAbort(t *testing.T) {
	s := prefilled(t, model.BF16)
	g := &gated{Memory: sink.NewMemory(len(s.Layers)), gate: make(chan struct{}, 100), fail: 1}
	for range 100 {
		g.gate <- struct{}{}
	}
	q := sink.NewQueue(g, 1)
	ctx := context.Background()
	for L := 0; L < 2; L++ {
		if err := q.Put(ctx, s.Layers[L]); err != nil {
			t.Fatalf("layer %d: %v", L, err)
		}
	}
	// The sink refuses layer 1: once the queue has seen it, every later
	// Put and the Close report it.
	for deadline := time.Now().Add(5 * time.Second); q.Err() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sink's refusal of layer 1 never reached the queue")
		}
	}
	for what, err := range map[string]error{"put": q.Put(ctx, s.Layers[2]), "close": q.Close(ctx, s.Tokens)} {
		if err == nil || !strings.Contains(err.Error(), "sink refused layer 1: link reset") {
			t.Fatalf("%s after the sink failed: %v", what, err)
		}
	}

	// Abort interrupts a PutLayer blocked on a stalled link.
	stalled := &gated{Memory: sink.NewMemory(len(s.Layers)), gate: make(chan struct{}), fail: -1}
	q = sink.NewQueue(stalled, 1)
	if err := q.Put(ctx, s.Layers[0]); err != nil {
		t.Fatal(err)
	}
	q.Abort(errors.New("job cancelled"))
	if err := q.Put(ctx, s.Layers[1]); !errors.Is(err, sink.ErrAborted) {
		t.Fatalf("put after abort: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := q.Close(cctx, 0); !errors.Is(err, sink.ErrAborted) {
		t.Fatalf("close after abort: %v", err)
	}
	if stalled.Aborted() == nil {
		t.Fatal("sink not aborted")
	}
}

// TestCheckSink: a real state passes layer by layer and leaves its sizes;
// a wrong shape, a NaN, a layer out of order, a wrong token count or a
// missing layer fails the sink, naming what is wrong.
func TestCheckSink(t *testing.T) {
	s := prefilled(t, model.BF16)
	cfg, err := model.LoadConfig(filepath.Join(testmodel.Dir(t, "tiny", 1, 2), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := sink.NewCheck(cfg, s.Tokens, model.BF16)
	for _, ls := range s.Layers {
		if err := c.PutLayer(ctx, ls); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Sizes(); !errors.Is(err, sink.ErrNotClosed) {
		t.Fatalf("sizes before Close: %v", err)
	}
	if err := c.Close(ctx, s.Tokens); err != nil {
		t.Fatal(err)
	}
	sizes, err := c.Sizes()
	if err != nil {
		t.Fatal(err)
	}
	for L, ls := range s.Layers {
		if sizes[L] != ls.Bytes() || sizes[L] == 0 {
			t.Fatalf("layer %d: %d bytes recorded, the state has %d", L, sizes[L], ls.Bytes())
		}
	}

	mla := -1
	for L := range s.Layers {
		if cfg.LayerKind(L) == model.MLA {
			mla = L
			break
		}
	}
	bad := func(name, want string, put func(c *sink.Check) error) {
		t.Helper()
		c := sink.NewCheck(cfg, s.Tokens, model.BF16)
		if err := put(c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, want)
		}
		if _, err := c.Sizes(); err == nil {
			t.Errorf("%s: the sink reports sizes after failing", name)
		}
	}
	putAll := func(c *sink.Check, edit func(L int, ls *model.LayerState)) error {
		for L, ls := range s.Layers {
			ls = ls.Clone()
			edit(L, ls)
			if err := c.PutLayer(ctx, ls); err != nil {
				return err
			}
		}
		return c.Close(ctx, s.Tokens)
	}
	bad("short cache", "expected", func(c *sink.Check) error {
		return putAll(c, func(L int, ls *model.LayerState) {
			if L == mla {
				p := &ls.Parts[0]
				p.Shape[0]--
				p.Data = p.Data[:len(p.Data)-len(p.Data)/s.Tokens]
			}
		})
	})
	bad("NaN", "NaN", func(c *sink.Check) error {
		return putAll(c, func(L int, ls *model.LayerState) {
			if L == 0 {
				ls.Parts[0].F32()[5] = float32(math.NaN())
			}
		})
	})
	bad("out of order", "after layer", func(c *sink.Check) error {
		c.PutLayer(ctx, s.Layers[1])
		return c.PutLayer(ctx, s.Layers[0])
	})
	bad("wrong token count", "tokens", func(c *sink.Check) error {
		for _, ls := range s.Layers {
			c.PutLayer(ctx, ls)
		}
		return c.Close(ctx, s.Tokens+1)
	})
	bad("missing layer", "closed after layer", func(c *sink.Check) error {
		c.PutLayer(ctx, s.Layers[0])
		return c.Close(ctx, s.Tokens)
	})
}
