package worker_test

import (
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/prefixstore"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// TestPrefixStoreResumes: a job whose tokens end on the store's grid leaves
// its state in the store; the next job that starts with those tokens
// prefills only the rest, and both states are bit-identical to the model
// core's from-scratch prefill; the second job supersedes the first's entry,
// and a job whose whole prompt is stored runs no pass.
func TestPrefixStoreResumes(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	v := 256
	long := testkit.Prompt(300, v, 1)
	turn1, turn2 := long[:129], long[:257] // 128 and 256 tokens to prefill
	other := testkit.Prompt(100, v, 2)
	want := references(t, dir, [][]int32{turn1, turn2, other})

	probe := newWorker(t, dir, 256<<20, -1, nil)
	st, _, err := prefixstore.Open(prefixstore.Config{Dir: t.TempDir(), MaxBytes: 1 << 30, Model: probe.Model(),
		Salt: prefixkey.Salt("tiny-test", uint8(model.BF16))})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Config{Model: dir, Budget: 256 << 20, Depth: -1, Threads: 2, Log: zaptest.NewLogger(t),
		ReadSize: 64 << 10, SinkTimeout: 2 * time.Second, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })

	if r := submit(t, w, "t1", turn1, nil).check(t, want[0]); r.Cached != 0 || r.Tokens != 128 {
		t.Fatalf("turn 1: %+v", r)
	}
	if l := st.List(); len(l) != 1 || l[0].Tokens != 128 {
		t.Fatalf("after turn 1 the store holds %+v", l)
	}
	if r := submit(t, w, "t2", turn2, nil).check(t, want[1]); r.Cached != 128 || r.Tokens != 128 {
		t.Fatalf("turn 2: %+v, want 128 cached and 128 prefilled", r)
	}
	if l := st.List(); len(l) != 1 || l[0].Tokens != 256 {
		t.Fatalf("after turn 2 the store holds %+v, want the 256-token entry alone", l)
	}
	// Off the grid (99 tokens): no entry; no hit.
	if r := submit(t, w, "o", other, nil).check(t, want[2]); r.Cached != 0 {
		t.Fatalf("another prompt: %+v", r)
	}
	passes := w.Stats().Passes
	if r := submit(t, w, "t2-again", turn2, nil).check(t, want[1]); r.Cached != 256 || r.Tokens != 0 {
		t.Fatalf("turn 2 again: %+v", r)
	}
	if got := w.Stats().Passes; got != passes {
		t.Fatalf("a stored prompt ran %d passes", got-passes)
	}
	if s := st.Stats(); s.Entries != 1 || s.Hits != 2 || s.Inserts != 2 {
		t.Fatalf("store stats %+v", s)
	}
}
