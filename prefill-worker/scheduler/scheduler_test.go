package scheduler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// The scheduler is exercised through the worker, which wires it to a real
// executor and streamer over the tiny preset (worker_test.go covers
// batching, super-chunks, cancellation and faults); these tests cover its
// admission rules.

func newWorker(t *testing.T) *worker.Worker {
	t.Helper()
	w, err := worker.New(worker.Config{Model: testmodel.Dir(t, "tiny", 1, 2), Budget: 64 << 20, Depth: 1, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestSubmitAllIsAtomic(t *testing.T) {
	w := newWorker(t)
	n := w.Model().NumLayers
	_, err := w.SubmitAll([]scheduler.Spec{
		{ID: "a", Tokens: []int32{1, 2}, Sink: sink.NewMemory(n)},
		{ID: "b", Tokens: []int32{1, 9999}, Sink: sink.NewMemory(n)},
	})
	if err == nil || !strings.Contains(err.Error(), "job b: token id 9999 at position 1") {
		t.Fatalf("bad batch: %v", err)
	}
	if _, err := w.SubmitAll([]scheduler.Spec{{ID: "c", Sink: sink.NewMemory(n)}, {ID: "c", Sink: sink.NewMemory(n)}}); err == nil {
		t.Fatal("a batch with a repeated id was accepted")
	}
	if _, err := w.Submit(scheduler.Spec{ID: "", Sink: sink.NewMemory(n)}); err == nil {
		t.Fatal("empty id accepted")
	}
	if _, err := w.Submit(scheduler.Spec{ID: "nosink", Tokens: []int32{1}}); err == nil {
		t.Fatal("job without a sink accepted")
	}
	// Nothing of the refused batches was queued: "a" is free.
	j, err := w.Submit(scheduler.Spec{ID: "a", Tokens: []int32{1, 2}, Sink: sink.NewMemory(n)})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.Completed != 1 || st.Passes != 1 {
		t.Fatalf("stats %+v", st.Stats)
	}
}

// TestEmptyPrompt: a one-token prompt has nothing to prefill; its sink gets
// every layer's empty state (what model.Start leaves before the first
// decode step) without a pass.
func TestEmptyPrompt(t *testing.T) {
	w := newWorker(t)
	mem := sink.NewMemory(w.Model().NumLayers)
	j, err := w.Submit(scheduler.Spec{ID: "one", Sink: mem})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := mem.State()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := w.Model().NewSeqState(0, w.Model().NumLayers, model.StateOptions{}).MarshalBinary()
	got, _ := st.MarshalBinary()
	if string(got) != string(want) || w.Stats().Passes != 0 {
		t.Fatalf("empty prompt: state differs or a pass ran (%d)", w.Stats().Passes)
	}
}

func TestDeadline(t *testing.T) {
	w := newWorker(t)
	j, err := w.Submit(scheduler.Spec{ID: "late", Tokens: make([]int32, 50), Sink: sink.NewMemory(w.Model().NumLayers),
		Deadline: time.Now().Add(-time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	err = j.Wait(context.Background())
	if err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("expired job: %v", err)
	}
	if errors.Is(err, scheduler.ErrCancelled) {
		t.Fatalf("a missed deadline is not a cancellation: %v", err)
	}
}
