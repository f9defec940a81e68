package worker_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testimage"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/vision"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

// imagePrompt is text, rows pads, text.
func imagePrompt(c *model.Config, before, rows, after int) []int32 {
	text := func(n, seed int) []int32 {
		t := testkit.Prompt(n, c.VocabSize, seed)
		for i := range t {
			if t[i] == c.MediaPadID() {
				t[i] = 1 // no stray pads in the text
			}
		}
		return t
	}
	p := text(before, 1)
	for range rows {
		p = append(p, c.MediaPadID())
	}
	return append(p, text(after, 2)...)
}

// TestImageJobSuperChunked: a prompt with a 300-row image, under a budget
// that cuts it into several passes, gets its rows from the worker's own
// tower (run once, before the first pass) and its state equals the model
// core's prefill with the same image's features, bit for bit. A job whose
// image does not fit its pad run is refused saying so.
func TestImageJobSuperChunked(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ctx := context.Background()
	c, err := model.LoadConfig(dir + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	img := testimage.PNG(t, 560, 420, 3) // 20 x 15 merged rows
	p := imagePrompt(c, 100, 300, 300)

	// The reference: the same tower's features in the model core.
	tw, err := vision.Load(ctx, cpu.New(2), dir)
	if err != nil {
		t.Fatal(err)
	}
	ref := imagejob.NewEncoder(c, tw, "reference")
	rj, err := ref.Prepare(p[:len(p)-1], [][]byte{img})
	if err != nil {
		t.Fatal(err)
	}
	feats, err := ref.Features(ctx, rj)
	tw.Close()
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, cpu.New(2), model.LoadOptions{Embed: true})
	if err != nil {
		t.Fatal(err)
	}
	st := m.NewState(0, c.NumLayers)
	if err := m.PrefillStateMedia(ctx, st, p[:len(p)-1], rj.Media(feats, 0)); err != nil {
		t.Fatal(err)
	}
	m.Close()
	want, _ := st.MarshalBinary()

	probe, err := worker.New(worker.Config{Model: dir, Budget: 1 << 30, Depth: 1, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	costs := probe.Costs()
	probe.Close()
	tower, err := imagejob.WeightBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	budget := tower + 2*costs.SlotBytes + costs.State(len(p)) + costs.Temps(planner.Align, 1) + 200*costs.ActPerToken
	var mu sync.Mutex
	passes := 0
	w := newWorker(t, dir, budget, 1, func(scheduler.PassReport) { mu.Lock(); passes++; mu.Unlock() })

	enc := w.Images()
	j, err := enc.Prepare(p[:len(p)-1], [][]byte{img})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	mem := sink.NewMemory(c.NumLayers)
	h, err := w.Submit(worker.Spec{ID: "img", Tokens: p[:len(p)-1], Sink: mem, Images: j.Keys(0),
		Encode: func(ctx context.Context) ([]model.Media, error) {
			runs++
			f, err := enc.Features(ctx, j)
			return j.Media(f, 0), err
		}})
	if err != nil {
		t.Fatal(err)
	}
	submitted{h, mem}.check(t, want)
	mu.Lock()
	defer mu.Unlock()
	if passes < 2 || runs != 1 {
		t.Fatalf("%d passes (want several) and %d tower runs (want 1)", passes, runs)
	}

	if _, err := enc.Prepare(imagePrompt(c, 10, 299, 5), [][]byte{img}); err == nil || !strings.Contains(err.Error(), "has 300 feature rows, the prompt holds 299 pad tokens") {
		t.Fatalf("a short pad run: %v", err)
	}
}

// TestImageJobCancelAndFailure: a job cancelled while its tower runs ends
// cancelled (the tower's context with it); a failing tower fails its job
// with the tower's error; the worker serves the next job.
func TestImageJobCancelAndFailure(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	w := newWorker(t, dir, 1<<30, 1, nil)
	p := testkit.Prompt(40, 256, 1)
	started, stopped := make(chan struct{}), make(chan error, 1)
	h, err := w.Submit(worker.Spec{ID: "cancelled", Tokens: p, Sink: sink.NewMemory(w.Model().NumLayers),
		Encode: func(ctx context.Context) ([]model.Media, error) {
			close(started)
			<-ctx.Done()
			stopped <- ctx.Err()
			return nil, ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if !w.Cancel("cancelled") {
		t.Fatal("the job was not known")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Wait(ctx); err == nil || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("cancelled job: %v", err)
	}
	if err := <-stopped; err == nil {
		t.Fatal("the tower's context was not cancelled")
	}
	h, err = w.Submit(worker.Spec{ID: "failed", Tokens: p, Sink: sink.NewMemory(w.Model().NumLayers),
		Encode: func(context.Context) ([]model.Media, error) { return nil, context.DeadlineExceeded }})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(ctx); err == nil || !strings.Contains(err.Error(), "image features") {
		t.Fatalf("failed tower: %v", err)
	}
	want := references(t, dir, [][]int32{append(p, 1)})
	submit(t, w, "next", append(p, 1), nil).check(t, want[0])
}

// deviceCPU is the CPU backend dressed as a device (it reports device
// memory), so that the worker treats it as a GPU's.
type deviceCPU struct{ *cpu.Backend }

func (deviceCPU) DeviceMemory() (free, total int64) { return 64 << 30, 80 << 30 }

// TestImageJobOnADevice: on a device backend the tower runs in the pass
// loop, between passes (a device's ops must come from one goroutine at a
// time): the state is the reference's, and a job cancelled while its tower
// holds the loop leaves it free for the next.
func TestImageJobOnADevice(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ctx := context.Background()
	c, err := model.LoadConfig(dir + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	img := testimage.PNG(t, 56, 84, 5) // 6 rows
	p := imagePrompt(c, 30, 6, 20)
	tw, err := vision.Load(ctx, cpu.New(2), dir)
	if err != nil {
		t.Fatal(err)
	}
	ref := imagejob.NewEncoder(c, tw, "reference")
	rj, err := ref.Prepare(p[:len(p)-1], [][]byte{img})
	if err != nil {
		t.Fatal(err)
	}
	feats, err := ref.Features(ctx, rj)
	tw.Close()
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, cpu.New(2), model.LoadOptions{Embed: true})
	if err != nil {
		t.Fatal(err)
	}
	st := m.NewState(0, c.NumLayers)
	if err := m.PrefillStateMedia(ctx, st, p[:len(p)-1], rj.Media(feats, 0)); err != nil {
		t.Fatal(err)
	}
	m.Close()
	want, _ := st.MarshalBinary()

	w, err := worker.New(worker.Config{Model: dir, Budget: 1 << 30, Depth: 1, Backend: deviceCPU{cpu.New(2)}, ReadSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	started := make(chan struct{})
	blocked, err := w.Submit(worker.Spec{ID: "blocked", Tokens: p[:10], Sink: sink.NewMemory(c.NumLayers),
		Encode: func(ctx context.Context) ([]model.Media, error) {
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	w.Cancel("blocked")
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := blocked.Wait(wctx); err == nil {
		t.Fatal("the cancelled job succeeded")
	}
	enc := w.Images()
	j, err := enc.Prepare(p[:len(p)-1], [][]byte{img})
	if err != nil {
		t.Fatal(err)
	}
	mem := sink.NewMemory(c.NumLayers)
	h, err := w.Submit(worker.Spec{ID: "img", Tokens: p[:len(p)-1], Sink: mem, Images: j.Keys(0),
		Encode: func(ctx context.Context) ([]model.Media, error) {
			f, err := enc.Features(ctx, j)
			return j.Media(f, 0), err
		}})
	if err != nil {
		t.Fatal(err)
	}
	submitted{h, mem}.check(t, want)
}
