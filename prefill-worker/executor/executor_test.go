package executor_test

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

	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/conformance"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/prefill-worker/executor"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
	"github.com/tandem-inference/tandem/prefill-worker/streamer"
)

const threads = 2

func newExecutor(t *testing.T, dir string, slots int, latent model.DType) *executor.Executor {
	t.Helper()
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	lay, err := streamer.NewLayout(ck, cfg.NumLayers, streamer.DefaultAlign)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(threads)
	s, err := streamer.New(lay, be, streamer.Options{Slots: slots, ReadSize: 64 << 10, Readers: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	emb, err := executor.NewEmbedder(ck, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := model.New(cfg, be)
	m.State.LatentDType = latent
	return &executor.Executor{Model: m, Stream: s, Embed: emb}
}

// reference prefills prompt[:-1] on the in-memory model core, alone, and
// returns the encoded state.
func reference(t *testing.T, dir string, latent model.DType, prompts [][]int32) [][]byte {
	t.Helper()
	m, err := model.Load(dir, cpu.New(threads), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.State.LatentDType = latent
	out := make([][]byte, len(prompts))
	for i, p := range prompts {
		s := m.NewState(0, m.Cfg.NumLayers)
		if err := m.PrefillState(context.Background(), []*model.SeqState{s}, [][]int32{p[:len(p)-1]}); err != nil {
			t.Fatal(err)
		}
		if out[i], err = s.MarshalBinary(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// job is one prompt being prefilled over one or more passes.
type job struct {
	id     string
	tokens []int32 // prompt[:-1]
	media  []model.Media
	done   int
	state  *model.SeqState
	mem    *sink.Memory
	out    *sink.Queue
	ctx    context.Context
}

func newJobs(e *executor.Executor, prompts [][]int32) []*job {
	c := e.Model.Cfg
	jobs := make([]*job, len(prompts))
	for i, p := range prompts {
		toks := p[:len(p)-1]
		mem := sink.NewMemory(c.NumLayers)
		jobs[i] = &job{id: fmt.Sprintf("job%d", i), tokens: toks, mem: mem, out: sink.NewQueue(mem, 4), ctx: context.Background(),
			state: c.NewSeqState(0, c.NumLayers, model.StateOptions{LatentDType: e.Model.State.LatentDType, LatentCapacity: len(toks)})}
	}
	return jobs
}

// runPasses prefills the jobs, each pass taking at most chunk tokens of
// each unfinished job (0: all), as the scheduler would.
func runPasses(t *testing.T, e *executor.Executor, jobs []*job, chunk, depth, tile int) {
	t.Helper()
	for pass := 1; ; pass++ {
		var seqs []*executor.Seq
		var who []*job
		for _, j := range jobs {
			if j.done >= len(j.tokens) {
				continue
			}
			hi := len(j.tokens)
			if chunk > 0 {
				hi = min(hi, j.done+chunk)
			}
			seqs = append(seqs, &executor.Seq{ID: j.id, Ctx: j.ctx, State: j.state, Tokens: j.tokens[j.done:hi],
				Media: model.MediaWindow(j.media, j.done, hi, e.Model.Cfg.HiddenSize), Final: hi == len(j.tokens), Out: j.out})
			who = append(who, j)
		}
		if len(seqs) == 0 {
			return
		}
		st, err := e.Run(context.Background(), seqs, executor.Options{Depth: depth, Tile: tile, Pass: pass})
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		// The pass timed its MLA attention apart (the cost model fits its
		// rate from that), on a backend whose ops run within the call.
		if _, device := e.Model.Backend.(kernels.DeviceMemory); device && st.Attention != 0 ||
			!device && !(st.Attention > 0 && st.Attention < st.Compute) {
			t.Fatalf("pass %d: %v of attention in %v of compute", pass, st.Attention, st.Compute)
		}
		for i, s := range seqs {
			if s.Err != nil {
				t.Fatalf("pass %d: %v", pass, s.Err)
			}
			who[i].done += len(s.Tokens)
			if s.Final {
				if err := who[i].out.Close(context.Background(), len(who[i].tokens)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func checkStates(t *testing.T, what string, jobs []*job, want [][]byte) {
	t.Helper()
	for i, j := range jobs {
		s, err := j.mem.State()
		if err != nil {
			t.Fatalf("%s: %s: %v", what, j.id, err)
		}
		got, err := s.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Fatalf("%s: %s (%d tokens): streamed state differs from the model core's prefill", what, j.id, len(j.tokens))
		}
	}
}

// TestStreamedPrefillBitIdentical: states from streamed passes equal the
// in-memory model core's prefill, byte for byte, for one and several
// prompts per pass, at every prefetch depth, with whole-batch layer calls
// and tiles, with and without super-chunks, for both MLA cache dtypes.
func TestStreamedPrefillBitIdentical(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	one := [][]int32{testkit.Prompt(151, cfg.VocabSize, 0)}
	several := [][]int32{testkit.Prompt(151, cfg.VocabSize, 1), testkit.Prompt(2, cfg.VocabSize, 2), testkit.Prompt(70, cfg.VocabSize, 3), testkit.Prompt(200, cfg.VocabSize, 4)}
	type pass struct{ chunk, tile int }
	all := []pass{{0, 0}, {0, 64}, {64, 0}, {128, 64}, {192, 128}}
	some := []pass{{0, 0}, {128, 64}}
	for _, tc := range []struct {
		latent model.DType
		depths []int
		passes func(depth int) []pass
	}{
		// Every split at depth 1; whole and super-chunked+tiled at the others.
		{model.BF16, []int{0, 1, 2, 3}, func(d int) []pass {
			if d == 1 {
				return all
			}
			return some
		}},
		{model.F32, []int{2}, func(int) []pass { return some }},
	} {
		wantOne := reference(t, dir, tc.latent, one)
		wantSeveral := reference(t, dir, tc.latent, several)
		for _, depth := range tc.depths {
			e := newExecutor(t, dir, depth+1, tc.latent)
			for _, p := range tc.passes(depth) {
				what := fmt.Sprintf("%s depth %d chunk %d tile %d", tc.latent, depth, p.chunk, p.tile)
				jobs := newJobs(e, one)
				runPasses(t, e, jobs, p.chunk, depth, p.tile)
				checkStates(t, what+" one prompt", jobs, wantOne)
				jobs = newJobs(e, several)
				runPasses(t, e, jobs, p.chunk, depth, p.tile)
				checkStates(t, what+" four prompts", jobs, wantSeveral)
			}
		}
	}
}

// TestStreamedPrefillSmall is the same check on the small preset (17
// layers, 512 experts, MXFP4), two prompts in one pass with tiles.
func TestStreamedPrefillSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("small model: generated once (~30 s) and ~10 s of compute")
	}
	dir := testmodel.Dir(t, "small", 1, 0)
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	prompts := [][]int32{testkit.Prompt(20, cfg.VocabSize, 5), testkit.Prompt(9, cfg.VocabSize, 6)}
	want := reference(t, dir, model.BF16, prompts)
	e := newExecutor(t, dir, 2, model.BF16)
	jobs := newJobs(e, prompts)
	runPasses(t, e, jobs, 0, 1, 64)
	checkStates(t, "small", jobs, want)
}

// gated is a sink whose link stalls until the gate opens.
type gated struct {
	*sink.Memory
	gate chan struct{}
}

func (g *gated) PutLayer(ctx context.Context, ls *model.LayerState) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Memory.PutLayer(ctx, ls)
}

// TestDropsOneJob cancels one job mid-pass and stalls another's sink: both
// are dropped with their own errors and aborted sinks, and the other jobs
// of the same pass finish with exact states.
func TestDropsOneJob(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	prompts := [][]int32{testkit.Prompt(100, cfg.VocabSize, 1), testkit.Prompt(60, cfg.VocabSize, 2), testkit.Prompt(90, cfg.VocabSize, 3), testkit.Prompt(30, cfg.VocabSize, 4)}
	want := reference(t, dir, model.BF16, prompts)
	e := newExecutor(t, dir, 2, model.BF16)
	jobs := newJobs(e, prompts)
	// Job 1 is cancelled after layer 3; job 2's link never moves.
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	jobs[1].ctx = ctx1
	stuck := &gated{Memory: sink.NewMemory(cfg.NumLayers), gate: make(chan struct{})}
	jobs[2].mem = stuck.Memory
	jobs[2].out = sink.NewQueue(stuck, 1)
	var seqs []*executor.Seq
	for _, j := range jobs {
		seqs = append(seqs, &executor.Seq{ID: j.id, Ctx: j.ctx, State: j.state, Tokens: j.tokens, Final: true, Out: j.out})
	}
	st, err := e.Run(context.Background(), seqs, executor.Options{Depth: 1, Tile: 64, SinkTimeout: 100 * time.Millisecond,
		Progress: func(p executor.Progress) {
			if p.Layer == 3 {
				cancel1()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Layers != cfg.NumLayers {
		t.Fatalf("pass ran %d layers", st.Layers)
	}
	if err := seqs[1].Err; err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "job1") || !strings.Contains(err.Error(), "layer 3") {
		t.Fatalf("cancelled job: %v", err)
	}
	if jobs[1].mem.Aborted() == nil || seqs[1].Emitted != 3 {
		t.Fatalf("cancelled job: sink aborted %v, %d layers emitted (want 3)", jobs[1].mem.Aborted(), seqs[1].Emitted)
	}
	if err := seqs[2].Err; err == nil || !strings.Contains(err.Error(), "sink queue full") || !strings.Contains(err.Error(), "job2") {
		t.Fatalf("stuck sink: %v", err)
	}
	for _, i := range []int{0, 3} {
		if seqs[i].Err != nil {
			t.Fatal(seqs[i].Err)
		}
		if err := jobs[i].out.Close(context.Background(), len(jobs[i].tokens)); err != nil {
			t.Fatal(err)
		}
	}
	checkStates(t, "survivors", []*job{jobs[0], jobs[3]}, [][]byte{want[0], want[3]})
}

// TestPassReadError: a shard deleted mid-pass fails every job of the pass
// with an error naming the job, the layer and the file; once the shard is
// back, the same executor serves the next pass exactly.
func TestPassReadError(t *testing.T) {
	src := testmodel.Dir(t, "tiny", 1, 0)
	dir := t.TempDir()
	ents, _ := os.ReadDir(src)
	for _, en := range ents {
		b, _ := os.ReadFile(filepath.Join(src, en.Name()))
		os.WriteFile(filepath.Join(dir, en.Name()), b, 0o644)
	}
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	prompts := [][]int32{testkit.Prompt(40, cfg.VocabSize, 1), testkit.Prompt(20, cfg.VocabSize, 2)}
	want := reference(t, dir, model.BF16, prompts)
	e := newExecutor(t, dir, 2, model.BF16)
	shard := e.Stream.Layout().Files[e.Stream.Layout().Layers[6].Extents[0].File]
	saved, _ := os.ReadFile(shard)
	jobs := newJobs(e, prompts)
	var seqs []*executor.Seq
	for _, j := range jobs {
		seqs = append(seqs, &executor.Seq{ID: j.id, State: j.state, Tokens: j.tokens, Final: true, Out: j.out})
	}
	_, err := e.Run(context.Background(), seqs, executor.Options{Depth: 0, Progress: func(p executor.Progress) {
		if p.Layer == 2 {
			os.Remove(shard)
		}
	}})
	if err == nil || !strings.Contains(err.Error(), "layer 6") || !strings.Contains(err.Error(), shard) {
		t.Fatalf("pass error: %v", err)
	}
	for i, s := range seqs {
		if s.Err == nil || !strings.Contains(s.Err.Error(), jobs[i].id) || !strings.Contains(s.Err.Error(), "layer 6") {
			t.Fatalf("job %d error: %v", i, s.Err)
		}
		if jobs[i].mem.Aborted() == nil {
			t.Fatalf("job %d: sink not aborted", i)
		}
	}
	t.Logf("read error: %v", seqs[0].Err)
	if err := os.WriteFile(shard, saved, 0o644); err != nil {
		t.Fatal(err)
	}
	jobs = newJobs(e, prompts)
	runPasses(t, e, jobs, 0, 1, 0)
	checkStates(t, "after restore", jobs, want)
}

// timedAbort records when its sequence was aborted.
type timedAbort struct {
	*sink.Memory
	at chan time.Time
}

func (s *timedAbort) Abort(err error) {
	select {
	case s.at <- time.Now():
	default:
	}
	s.Memory.Abort(err)
}

// TestCancelWithinALongMLALayer cancels a job in the middle of a long MLA
// layer (the small preset's first MLA layer over 1,536 tokens, cut into
// calls of DefaultTileFLOPs): it leaves that layer at the next call, well
// within a second, with the layer's partial work dropped (its rows leave
// the batch), and the other job of the pass goes on to a state
// bit-identical to the model core's.
func TestCancelWithinALongMLALayer(t *testing.T) {
	dir := testmodel.Dir(t, "small", 1, 0)
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	mla := -1
	for L := 0; L < cfg.NumLayers && mla < 0; L++ {
		if cfg.LayerKind(L) == model.MLA {
			mla = L
		}
	}
	prompts := [][]int32{testkit.Prompt(1537, cfg.VocabSize, 1), testkit.Prompt(200, cfg.VocabSize, 2)}
	want := reference(t, dir, model.BF16, prompts[1:])
	e := newExecutor(t, dir, 2, model.BF16)
	jobs := newJobs(e, prompts)
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	jobs[0].ctx = ctxA
	abortA := &timedAbort{Memory: jobs[0].mem, at: make(chan time.Time, 1)}
	jobs[0].out = sink.NewQueue(abortA, 4)
	var mu sync.Mutex
	var calls, afterCancel int // calls of the MLA layer; of them, after the cancel
	var cancelled time.Time
	executor.SetOnCall(e, func(L int, _ planner.Range) {
		if L != mla {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		if !cancelled.IsZero() {
			afterCancel++
		}
		if calls == 3 {
			cancelled = time.Now()
			go cancelA() // from elsewhere, as a client's cancel comes
		}
	})
	var seqs []*executor.Seq
	for _, j := range jobs {
		seqs = append(seqs, &executor.Seq{ID: j.id, Ctx: j.ctx, State: j.state, Tokens: j.tokens, Final: true, Out: j.out})
	}
	st, err := e.Run(context.Background(), seqs, executor.Options{Depth: 1})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls < 6 {
		t.Fatalf("layer %d ran in %d calls: not cut finely enough to cancel within it", mla, calls)
	}
	if err := seqs[0].Err; err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), fmt.Sprintf("during layer %d", mla)) {
		t.Fatalf("cancelled job: %v; want it dropped during layer %d", err, mla)
	}
	if seqs[0].Emitted != mla {
		t.Fatalf("cancelled job emitted %d layers, want %d (the cancelled layer's partial work dropped)", seqs[0].Emitted, mla)
	}
	left := (<-abortA.at).Sub(cancelled)
	t.Logf("layer %d in %d calls; the job left %v after its cancel, %d calls later; the pass: %d calls, compute %v", mla, calls, left, afterCancel, st.Calls, st.Compute)
	if left > time.Second {
		t.Fatalf("the job left %v after its cancel, want within a second", left)
	}
	if seqs[1].Err != nil {
		t.Fatal(seqs[1].Err)
	}
	if err := jobs[1].out.Close(context.Background(), len(jobs[1].tokens)); err != nil {
		t.Fatal(err)
	}
	checkStates(t, "the other job", jobs[1:], want)
}

// TestStreamedPrefillOnOpaqueTensors: passes on a backend whose tensors hide
// their values as a device's do (conformance.Opaque: Data nil) give the
// reference's states bit for bit, super-chunked and in tiles (row views,
// block-start copies) and with a job dropped: the executor and the model
// move values only through the backend.
func TestStreamedPrefillOnOpaqueTensors(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	several := [][]int32{testkit.Prompt(151, cfg.VocabSize, 1), testkit.Prompt(2, cfg.VocabSize, 2), testkit.Prompt(70, cfg.VocabSize, 3)}
	want := reference(t, dir, model.BF16, several)
	e := newExecutor(t, dir, 2, model.BF16)
	m := model.New(e.Model.Cfg, conformance.Opaque{CPU: cpu.New(2)})
	m.State = e.Model.State
	e.Model = m
	for _, p := range []struct{ chunk, tile int }{{0, 0}, {128, 64}} {
		jobs := newJobs(e, several)
		runPasses(t, e, jobs, p.chunk, 1, p.tile)
		checkStates(t, fmt.Sprintf("opaque tensors, chunk %d tile %d", p.chunk, p.tile), jobs, want)
	}
}

// failingDevice is a backend whose device fails under the after-th MatMul,
// as a device backend reports it (a kernels.DeviceError panic).
type failingDevice struct {
	kernels.Backend
	after int
	calls int
}

func (f *failingDevice) MatMul(dst, x *kernels.Tensor, w *kernels.Matrix) {
	if f.calls++; f.calls == f.after {
		panic(&kernels.DeviceError{Err: errors.New("out of memory (planted)")})
	}
	f.Backend.MatMul(dst, x, w)
}

// A device failing in the middle of a pass fails that pass's jobs with the
// device's error, not the process, and the next pass on a healthy device
// computes the same states as the reference.
func TestDeviceFailureFailsThePass(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 0)
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	prompts := [][]int32{testkit.Prompt(40, cfg.VocabSize, 1), testkit.Prompt(20, cfg.VocabSize, 2)}
	want := reference(t, dir, model.BF16, prompts)
	e := newExecutor(t, dir, 2, model.BF16)
	healthy := e.Model
	m := model.New(healthy.Cfg, &failingDevice{Backend: healthy.Backend, after: 20})
	m.State = healthy.State
	e.Model = m
	jobs := newJobs(e, prompts)
	var seqs []*executor.Seq
	for _, j := range jobs {
		seqs = append(seqs, &executor.Seq{ID: j.id, State: j.state, Tokens: j.tokens, Final: true, Out: j.out})
	}
	_, err := e.Run(context.Background(), seqs, executor.Options{Depth: 1, Pass: 7})
	var dev *kernels.DeviceError
	if !errors.As(err, &dev) || !strings.Contains(err.Error(), "pass 7") || !strings.Contains(err.Error(), "planted") {
		t.Fatalf("pass error: %v", err)
	}
	for i, s := range seqs {
		if !errors.As(s.Err, &dev) || !strings.Contains(s.Err.Error(), jobs[i].id) {
			t.Fatalf("job %d error: %v", i, s.Err)
		}
		if jobs[i].mem.Aborted() == nil {
			t.Fatalf("job %d: sink not aborted", i)
		}
	}
	e.Model = healthy
	jobs = newJobs(e, prompts)
	runPasses(t, e, jobs, 0, 1, 0)
	checkStates(t, "after the device failure", jobs, want)
}

// Any other panic is a programmer error: the executor does not hide it.
func TestOtherPanicsAreNotCaught(t *testing.T) {
	defer func() {
		if p := recover(); p != "not a device error" {
			t.Fatalf("recovered %v, want the original panic", p)
		}
	}()
	func() (err error) {
		defer kernels.CatchDevice(&err)
		panic("not a device error")
	}()
}

// TestStreamedPrefillWithImages: prompts whose images' feature rows replace
// their pad runs give, streamed, the model core's state with the features,
// bit for bit, whole and in super-chunks whose boundaries cut a run (each
// piece takes its window of the rows), in tiles, next to a text prompt, and
// on a backend whose tensors hide their values.
func TestStreamedPrefillWithImages(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	cfg, _ := model.LoadConfig(filepath.Join(dir, "config.json"))
	a, am := testmodel.ImagePrompt(cfg, []int{40, 30, 9}, []int{50, 20}, []uint64{1, 2})
	b, bm := testmodel.ImagePrompt(cfg, []int{3, 100}, []int{70}, []uint64{3})
	prompts := [][]int32{a, testkit.Prompt(90, cfg.VocabSize, 5), b}
	media := [][]model.Media{am, nil, bm}

	m, err := model.Load(dir, cpu.New(threads), model.LoadOptions{Embed: true})
	if err != nil {
		t.Fatal(err)
	}
	want := make([][]byte, len(prompts))
	for i, p := range prompts {
		s := m.NewState(0, m.Cfg.NumLayers)
		if err := m.PrefillStateMedia(context.Background(), s, p[:len(p)-1], media[i]); err != nil {
			t.Fatal(err)
		}
		want[i], _ = s.MarshalBinary()
	}
	m.Close()

	e := newExecutor(t, dir, 2, model.BF16)
	run := func(what string, chunk, tile int) {
		jobs := newJobs(e, prompts)
		for i := range jobs {
			jobs[i].media = media[i]
		}
		runPasses(t, e, jobs, chunk, 1, tile)
		checkStates(t, fmt.Sprintf("images%s, chunk %d tile %d", what, chunk, tile), jobs, want)
	}
	for _, p := range []struct{ chunk, tile int }{{0, 0}, {64, 0}, {64, 32}} {
		run("", p.chunk, p.tile)
	}
	// The rows reach the batch through the backend alone (Upload and
	// CopyBlock), as on a device whose tensors hide their values.
	opaque := model.New(e.Model.Cfg, conformance.Opaque{CPU: cpu.New(2)})
	opaque.State = e.Model.State
	e.Model = opaque
	run(" on opaque tensors", 64, 32)
}
