package worker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/worker"
)

func TestMain(m *testing.M) {
	if os.Getenv(rssChildEnv) != "" {
		rssChild()
		return
	}
	goleak.VerifyTestMain(testkit.Isolated(m))
}

// references prefills each prompt[:-1] alone on the in-memory model core.
func references(t testing.TB, dir string, prompts [][]int32) [][]byte {
	t.Helper()
	m, err := model.Load(dir, cpu.New(2), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out := make([][]byte, len(prompts))
	for i, p := range prompts {
		s := m.NewState(0, m.Cfg.NumLayers)
		if len(p) > 1 {
			if err := m.PrefillState(context.Background(), []*model.SeqState{s}, [][]int32{p[:len(p)-1]}); err != nil {
				t.Fatal(err)
			}
		}
		if out[i], err = s.MarshalBinary(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func newWorker(t *testing.T, dir string, budget int64, depth int, onPass func(scheduler.PassReport)) *worker.Worker {
	t.Helper()
	w, err := worker.New(worker.Config{Model: dir, Budget: budget, Depth: depth, Threads: 2, Log: zaptest.NewLogger(t),
		ReadSize: 64 << 10, SinkTimeout: 2 * time.Second, OnPass: onPass})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Error(err)
		}
	})
	return w
}

type submitted struct {
	job *worker.Job
	mem *sink.Memory
}

func submit(t *testing.T, w *worker.Worker, id string, p []int32, progress func(scheduler.Progress)) submitted {
	t.Helper()
	mem := sink.NewMemory(w.Model().NumLayers)
	j, err := w.Submit(worker.Spec{ID: id, Tokens: p[:len(p)-1], Sink: mem, Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	return submitted{j, mem}
}

func (s submitted) check(t *testing.T, want []byte) scheduler.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.job.Wait(ctx); err != nil {
		t.Fatalf("job %s: %v", s.job.ID(), err)
	}
	st, err := s.mem.State()
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("job %s: state differs from the model core's prefill", s.job.ID())
	}
	return s.job.Result()
}

// TestBatchesWaitingJobs: jobs queued before a pass share it; a job that
// arrives during a pass waits for the next one; both are exact. A one-token
// prompt gets every layer's empty state without a pass.
func TestBatchesWaitingJobs(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	v := 256
	prompts := [][]int32{testkit.Prompt(50, v, 1), testkit.Prompt(9, v, 2), testkit.Prompt(120, v, 3), testkit.Prompt(30, v, 4), testkit.Prompt(1, v, 5)}
	want := references(t, dir, prompts)
	var mu sync.Mutex
	var reports []scheduler.PassReport
	w := newWorker(t, dir, 256<<20, -1, func(r scheduler.PassReport) {
		mu.Lock()
		reports = append(reports, r)
		mu.Unlock()
	})
	// Pass 1 takes job a alone and is held at its first layer while b, c
	// and d queue: b and c must share pass 2 (d, a one-token prompt, needs
	// no pass). During pass 2, b's progress submits "late": pass 3.
	started, gate := make(chan struct{}), make(chan struct{})
	first := submit(t, w, "a", prompts[0], func(p scheduler.Progress) {
		if p.Pass == 1 && p.Layer == 1 {
			close(started)
			<-gate
		}
	})
	<-started
	lateMem := sink.NewMemory(w.Model().NumLayers)
	lateJob := make(chan *worker.Job, 1)
	var once sync.Once
	b := submit(t, w, "b", prompts[1], func(p scheduler.Progress) {
		if p.Pass == 2 && p.Layer == 2 {
			once.Do(func() {
				j, err := w.Submit(worker.Spec{ID: "late", Tokens: prompts[2][:len(prompts[2])-1], Sink: lateMem})
				if err != nil {
					panic(err)
				}
				lateJob <- j
			})
		}
	})
	c := submit(t, w, "c", prompts[3], nil)
	d := submit(t, w, "d", prompts[4], nil)
	close(gate)
	if r := first.check(t, want[0]); r.Passes != 1 {
		t.Errorf("job a took %d passes", r.Passes)
	}
	b.check(t, want[1])
	c.check(t, want[3])
	d.check(t, want[4])
	late := submitted{<-lateJob, lateMem}
	late.check(t, want[2])
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 3 {
		t.Fatalf("%d passes, want 3 (a; b+c; late)", len(reports))
	}
	ids := func(r scheduler.PassReport) string {
		var s []string
		for _, p := range r.Plan.Pieces {
			s = append(s, p.ID)
		}
		return strings.Join(s, ",")
	}
	if ids(reports[0]) != "a" || ids(reports[1]) != "b,c" || ids(reports[2]) != "late" {
		t.Fatalf("passes took %q, %q, %q; want a | b,c | late", ids(reports[0]), ids(reports[1]), ids(reports[2]))
	}
	if !reports[1].Plan.Pieces[0].Final || reports[1].Stats.Tokens != len(prompts[1])+len(prompts[3])-2 {
		t.Fatalf("pass 2: %s, %d tokens", reports[1].Plan, reports[1].Stats.Tokens)
	}
	st := w.Stats()
	if st.Completed != 5 || st.Passes != 3 || st.PrefillTokensPerSec <= 0 || st.PassFloor <= 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSuperChunkedUnderBudget gives the worker a budget that holds the
// ring, both states, and a few hundred tokens of activations beside the
// temporaries: the long prompt takes several passes, the last shared with
// the short one, and both states are exact.
func TestSuperChunkedUnderBudget(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	v := 256
	prompts := [][]int32{testkit.Prompt(700, v, 1), testkit.Prompt(40, v, 2)}
	want := references(t, dir, prompts)
	// Size the budget from the worker's own memory model: depth 1 ring, both
	// states, 64-row tiles and about 200 tokens' activations (plus the
	// second job's share of temporaries while it waits).
	probe, err := worker.New(worker.Config{Model: dir, Budget: 1 << 30, Depth: 1, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	c := probe.Costs()
	probe.Close()
	budget := 2*c.SlotBytes + c.State(699) + c.State(39) + c.Temps(planner.Align, 2) + 200*c.ActPerToken
	var mu sync.Mutex
	var plans []string
	w := newWorker(t, dir, budget, 1, func(r scheduler.PassReport) {
		mu.Lock()
		plans = append(plans, r.Plan.String())
		mu.Unlock()
	})
	long := submit(t, w, "long", prompts[0], nil)
	short := submit(t, w, "short", prompts[1], nil)
	r := long.check(t, want[0])
	short.check(t, want[1])
	mu.Lock()
	defer mu.Unlock()
	for _, p := range plans {
		t.Log(p)
	}
	if r.Passes < 2 {
		t.Fatalf("the long prompt took %d pass under a budget that cannot hold its activations", r.Passes)
	}
	if !strings.Contains(strings.Join(plans, "\n"), "super-chunk") {
		t.Fatal("no plan mentions a super-chunk")
	}
}

// TestCancelAndFaults: a job cancelled mid-pass leaves it with a clear error
// and the job sharing the pass is exact; a prompt too large for the budget
// is refused with the reason; a shard deleted mid-pass fails the pass's jobs
// naming the layer and file; after each, the worker serves the next job.
func TestCancelAndFaults(t *testing.T) {
	src := testmodel.Dir(t, "tiny", 1, 0)
	dir := t.TempDir()
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(src, e.Name()))
		os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644)
	}
	v := 256
	prompts := [][]int32{testkit.Prompt(60, v, 1), testkit.Prompt(80, v, 2), testkit.Prompt(20, v, 3)}
	want := references(t, dir, prompts)
	w := newWorker(t, dir, 64<<20, 1, nil)

	// Cancel "x" at layer 3 of its pass; "y" shares the pass.
	var x submitted
	x = submit(t, w, "x", prompts[0], func(p scheduler.Progress) {
		if p.Layer == 3 {
			w.Cancel("x")
		}
	})
	y := submit(t, w, "y", prompts[1], nil)
	err := x.job.Wait(context.Background())
	if !errors.Is(err, scheduler.ErrCancelled) || !strings.Contains(err.Error(), "job x") {
		t.Fatalf("cancelled job: %v", err)
	}
	if x.mem.Aborted() == nil {
		t.Fatal("cancelled job's sink was not aborted")
	}
	y.check(t, want[1])
	if w.Cancel("x") || w.Cancel("nobody") {
		t.Fatal("Cancel of a finished or unknown job reported true")
	}

	// Cancel while waiting for the next pass: finishes at once.
	started, gate := make(chan struct{}), make(chan struct{})
	hold := submit(t, w, "hold", prompts[2], func(p scheduler.Progress) {
		if p.Layer == 1 {
			close(started)
			<-gate
		}
	})
	<-started
	waiter := submit(t, w, "waiter", prompts[2], nil)
	w.Cancel("waiter")
	if err := waiter.job.Wait(context.Background()); !errors.Is(err, scheduler.ErrCancelled) {
		t.Fatalf("waiting job cancelled: %v", err)
	}
	close(gate)
	hold.check(t, want[2])

	// Too large for the budget.
	huge := make([]int32, 3_000_000)
	hj, err := w.Submit(worker.Spec{ID: "huge", Tokens: huge, Sink: sink.NewMemory(w.Model().NumLayers)})
	if err != nil {
		t.Fatal(err)
	}
	if err := hj.Wait(context.Background()); !errors.Is(err, planner.ErrBudget) || !strings.Contains(err.Error(), "3000000 tokens") {
		t.Fatalf("oversized job: %v", err)
	}

	// A shard deleted mid-pass.
	shard := w.Streamer().Layout().Files[w.Streamer().Layout().Layers[6].Extents[0].File]
	saved, _ := os.ReadFile(shard)
	f := submit(t, w, "f", prompts[0], func(p scheduler.Progress) {
		if p.Layer == 2 {
			os.Remove(shard)
		}
	})
	err = f.job.Wait(context.Background())
	if err == nil || !strings.Contains(err.Error(), "job f") || !strings.Contains(err.Error(), "layer 6") || !strings.Contains(err.Error(), shard) {
		t.Fatalf("job of a pass that lost a shard: %v", err)
	}
	t.Log(err)
	os.WriteFile(shard, saved, 0o644)
	submit(t, w, "after", prompts[0], nil).check(t, want[0])

	// Bad token ids are refused at submit.
	if _, err := w.Submit(worker.Spec{ID: "bad", Tokens: []int32{1, 999}, Sink: sink.NewMemory(9)}); err == nil || !strings.Contains(err.Error(), "position 1") {
		t.Fatalf("bad token: %v", err)
	}
	st := w.Stats()
	if st.Cancelled != 2 || st.Failed != 2 {
		t.Fatalf("stats: %d cancelled, %d failed; want 2 and 2", st.Cancelled, st.Failed)
	}
}

// TestDryRunPlan: the plan for given prompt lengths, without a pass.
func TestDryRunPlan(t *testing.T) {
	w := newWorker(t, testmodel.Dir(t, "tiny", 1, 2), 64<<20, -1, nil)
	p, err := w.Plan([]int{100, 5000})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Pieces) != 2 || p.Tokens != 5100 || p.Depth != w.Depth() {
		t.Fatalf("plan %s", p)
	}
	if s := p.String(); !strings.Contains(s, fmt.Sprintf("depth %d", w.Depth())) {
		t.Fatalf("plan line %q", s)
	}
}

// TestPassFloorIsTheReadCostNotAComputeBoundPassWall: after a pass that
// compute held back (a long prompt on a small model: the ring stays full
// and the last byte lands near the pass's end), the pass floor the worker
// advertises is what reading the weights costs (bytes over the time reads
// were in flight), far below that pass's read wall time and near a plain
// read of the same files; and the compute terms are fitted to the pass.
func TestPassFloorIsTheReadCostNotAComputeBoundPassWall(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	w := newWorker(t, dir, 256<<20, 1, nil)
	// 4096 tokens: with 1024 the reads of a loaded machine (their
	// goroutines descheduled: 183 ms in flight for 0.86 MB) came within 5x
	// of the compute.
	p := testkit.Prompt(4097, 256, 1)
	s := submit(t, w, "long", p, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.job.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	wall := st.LastPass.Stats.ReadWall
	if st.PassFloor <= 0 || st.ReadBytesPerSec <= 0 {
		t.Fatalf("no pass floor after a pass: %+v", st)
	}
	if st.LastPass.Stats.Compute < 5*st.LastPass.Stats.ReadBusy {
		t.Fatalf("the pass was not compute-bound (compute %v, reads busy %v): the test's premise", st.LastPass.Stats.Compute, st.LastPass.Stats.ReadBusy)
	}
	if st.PassFloor*3 > wall {
		t.Fatalf("pass floor %v against the compute-bound pass's read wall %v: the floor must be the read cost", st.PassFloor, wall)
	}
	n, raw, err := w.Streamer().RawRead(ctx, w.Streamer().Readers())
	if err != nil || n <= 0 {
		t.Fatal(n, err)
	}
	// The page cache and the load of a shared machine move both by
	// several times (at load 20-30 on 2 cores: 52 ms against 1.3 ms); a
	// compute-bound wall is seconds here.
	if st.PassFloor > 20*raw+100*time.Millisecond {
		t.Fatalf("pass floor %v, a plain read of the same bytes %v", st.PassFloor, raw)
	}
	if st.ComputeSamples != 1 || !st.Compute.Known() {
		t.Fatalf("compute terms %v from %d samples after one pass", st.Compute, st.ComputeSamples)
	}
	m := w.CostModel()
	fitted := st.Compute.Time(m.Work(0, len(p)-1), m.Layers)
	if r := fitted.Seconds() / st.LastPass.Stats.Compute.Seconds(); r < 0.99 || r > 1.01 {
		t.Fatalf("the fit prices the pass at %v, it took %v", fitted, st.LastPass.Stats.Compute)
	}
	t.Logf("read wall %v, pass floor %v (%.2f GB/s), raw read %v, compute %v", wall, st.PassFloor, st.ReadBytesPerSec/1e9, raw, st.LastPass.Stats.Compute)
}
