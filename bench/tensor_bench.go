package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kvtransfer"
	"github.com/tandem-inference/tandem/kvtransfer/rdma"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/model"
)

// tensorBench is decodegroup --tensor: one rank against a stage of tensor
// ranks (pipeline 1), each on one core with --processes.
type tensorBench struct {
	mf        *modelFlags
	tensor    int
	processes bool
	seqs      []int
	prompt    int
	tokens    int
	json      bool
	// transport is "tcp" (or empty) or "rdma-fake": the collective on the
	// RDMA link over the in-process fake verbs wire.
	transport string
	// computeOnly times tensor rank 0 alone with its reductions left out.
	computeOnly bool
}

// run measures tensor 1 then tensor T on the same sequences, checks that
// both generate the same ids, and prints the table and the ratios.
func (tb *tensorBench) run(ctx context.Context) error {
	switch {
	case tb.transport != "" && tb.transport != "tcp" && tb.transport != "rdma-fake":
		return fmt.Errorf("--transport %q: want tcp or rdma-fake", tb.transport)
	case tb.transport == "rdma-fake" && tb.processes:
		return fmt.Errorf("--transport rdma-fake runs the ranks in this process (the fake wire is in memory); leave out --processes")
	}
	c, err := model.LoadConfig(filepath.Join(tb.mf.dir, "config.json"))
	if err != nil {
		return err
	}
	if err := c.CheckShard(tb.tensor); err != nil {
		return fmt.Errorf("--tensor: %w", err)
	}
	if tb.computeOnly {
		return tb.runComputeOnly(ctx)
	}
	res := map[int][]tensorRun{}
	if !tb.json {
		fmt.Printf("| pipeline | tensor | seqs | tok/s | ms/step | compute ms/step | collective ms/step | queued ms/step | reductions/step |\n")
		fmt.Printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	for _, T := range []int{1, tb.tensor} {
		runs, err := tb.stage(ctx, T)
		if err != nil {
			return fmt.Errorf("tensor %d: %w", T, err)
		}
		res[T] = runs
		for _, r := range runs {
			tb.print(T, r)
		}
	}
	for i := range res[1] {
		if a, b := res[1][i], res[tb.tensor][i]; !slices.Equal(a.IDs, b.IDs) {
			return fmt.Errorf("%d sequences: tensor %d generated %v, one rank %v", a.Sequences, tb.tensor, b.IDs, a.IDs)
		}
	}
	if tb.json {
		return nil
	}
	one, split := res[1], res[tb.tensor]
	fmt.Printf("\ngreedy ids of tensor %d equal one rank's at every batch size\n", tb.tensor)
	fmt.Printf("%d sequences: tensor %d step = %.2fx one rank's; collective %.0f%% of its step\n",
		one[0].Sequences, tb.tensor, split[0].StepMS/one[0].StepMS, 100*split[0].CollectiveMS/split[0].StepMS)
	last := len(one) - 1
	fmt.Printf("%d sequences: tensor %d = %.2fx one rank's tok/s; collective %.0f%% of its step\n",
		one[last].Sequences, tb.tensor, split[last].TokS/one[last].TokS, 100*split[last].CollectiveMS/split[last].StepMS)
	return nil
}

func (tb *tensorBench) print(T int, r tensorRun) {
	if tb.json {
		b, _ := json.Marshal(map[string]any{"pipeline": 1, "tensor": T, "sequences": r.Sequences, "tok_s": r.TokS,
			"ms_per_step": r.StepMS, "collective_ms_per_step": r.CollectiveMS, "compute_ms_per_step": r.StepMS - r.CollectiveMS,
			"queued_ms_per_step": 0.0, "processes": tb.processes})
		fmt.Println(string(b))
		return
	}
	fmt.Printf("| 1 | %d | %d | %.1f | %.1f | %.1f | %.1f | 0.0 | %.0f |\n", T, r.Sequences, r.TokS, r.StepMS,
		r.StepMS-r.CollectiveMS, r.CollectiveMS, r.Reductions)
}

// stage runs the T ranks (goroutines, or processes pinned to cores 0..T-1)
// and returns rank 0's figures.
func (tb *tensorBench) stage(ctx context.Context, T int) ([]tensorRun, error) {
	addrs, err := freeAddrs(T)
	if err != nil {
		return nil, err
	}
	secret := make([]byte, 16)
	rand.Read(secret)
	cfgs := make([]tensorRankConfig, T)
	for r := range cfgs {
		cfgs[r] = tensorRankConfig{Model: tb.mf.dir, Cache: tb.mf.cache, Rank: r, Ranks: T, Addrs: addrs, Secret: hex.EncodeToString(secret),
			Seqs: tb.seqs, Prompt: tb.prompt, Tokens: tb.tokens, Threads: max(tb.mf.threads, 1), Core: -1}
	}
	if tb.transport == "rdma-fake" {
		fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
		for r := range cfgs {
			t, err := rdma.New(rdma.Config{Provider: fab.Host(fmt.Sprintf("rank%d", r), benchGID)})
			if err != nil {
				return nil, err
			}
			defer t.Close()
			cfgs[r].transport = kvtransfer.RDMA{T: t}
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([][]tensorRun, T)
	errs := make([]error, T)
	var wg sync.WaitGroup
	for r := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tb.processes {
				cfgs[r].Core, cfgs[r].Threads = r, 1
				out[r], errs[r] = rankProcess(ctx, cfgs[r])
			} else {
				out[r], errs[r] = runTensorRank(ctx, cfgs[r])
			}
			if errs[r] != nil {
				cancel() // the others would wait on this rank's reductions
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return out[0], nil
}

// rankProcess runs one rank as a child process of this binary.
func rankProcess(ctx context.Context, cfg tensorRankConfig) ([]tensorRun, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	conf, _ := json.Marshal(cfg)
	cmd := exec.CommandContext(ctx, exe, "tensor-rank", "--config", string(conf))
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, err
	}
	var runs []tensorRun
	if err := json.Unmarshal(stdout.Bytes(), &runs); err != nil {
		return nil, fmt.Errorf("reading its figures: %w", err)
	}
	return runs, nil
}

// freeAddrs picks n free loopback TCP addresses.
func freeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		out[i] = l.Addr().String()
		l.Close()
	}
	return out, nil
}

// generateTensor is generate --tensor T: the ranks of one split stage in
// this process (model.LocalReducers), each loading only its slices; every
// rank generates, and rank 0's ids are returned once all agree.
func generateTensor(ctx context.Context, mf *modelFlags, n, T int) ([]int32, error) {
	ids, err := parseTokenIDs(mf.ids)
	if err != nil {
		return nil, err
	}
	dt, err := model.ParseCacheDType(mf.cache)
	if err != nil {
		return nil, fmt.Errorf("--cache-dtype: %w", err)
	}
	red := model.LocalReducers(T)
	out := make([][]int32, T)
	errs := make([]error, T)
	var wg sync.WaitGroup
	for r := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if errs[r] != nil {
					red[r].Close()
				}
			}()
			m, err := model.Load(mf.dir, cpu.New(max(mf.threads, 1)), model.LoadOptions{Embed: true, Head: true, LatentNormEps: mf.latentEps, Shard: model.Shard{Rank: r, Ranks: T}})
			if err != nil {
				errs[r] = err
				return
			}
			defer m.Close()
			m.State.LatentDType, m.Reduce = dt, red[r]
			out[r], errs[r] = m.Generate(ctx, ids, n)
		}()
	}
	wg.Wait()
	for r := range out {
		if errs[r] != nil {
			return nil, fmt.Errorf("tensor rank %d: %w", r, errs[r])
		}
		if !slices.Equal(out[r], out[0]) {
			return nil, fmt.Errorf("tensor rank %d generated %v, rank 0 %v", r, out[r], out[0])
		}
	}
	return out[0], nil
}

// stageRanks is a pipeline of stages of tensor ranks in this process, the
// activations handed from stage s rank t to stage s+1 rank t in memory
// (every rank of a stage holds the same bits after its reductions).
type stageRanks struct {
	ms   [][]*model.Model // [stage][t]
	seqs [][]*model.SeqState
}

// loadStages loads P stages of T ranks, each binding only its layers'
// slices, with each stage's LocalReducers.
func loadStages(mf *modelFlags, P, T int) (*stageRanks, func(), error) {
	c, err := model.LoadConfig(filepath.Join(mf.dir, "config.json"))
	if err != nil {
		return nil, nil, err
	}
	ranges, err := rank.Split(c.NumLayers, P)
	if err != nil {
		return nil, nil, err
	}
	dt, err := model.ParseCacheDType(mf.cache)
	if err != nil {
		return nil, nil, fmt.Errorf("--cache-dtype: %w", err)
	}
	st := &stageRanks{ms: make([][]*model.Model, P)}
	var loaded []*model.Loaded
	closeAll := func() {
		for _, l := range loaded {
			l.Close()
		}
	}
	for s, lr := range ranges {
		red := model.LocalReducers(T)
		for t := range T {
			l, err := model.Load(mf.dir, cpu.New(max(mf.threads, 1)), model.LoadOptions{Lo: lr[0], Hi: lr[1], Embed: s == 0, Head: s == P-1,
				LatentNormEps: mf.latentEps, Shard: model.Shard{Rank: t, Ranks: T}})
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("stage %d rank %d: %w", s, t, err)
			}
			loaded = append(loaded, l)
			l.State.LatentDType, l.Reduce = dt, red[t]
			st.ms[s] = append(st.ms[s], l.Model)
		}
	}
	return st, closeAll, nil
}

// step runs one step of one sequence through every stage and, with head,
// returns the greedy token of each rank of the last stage.
func (st *stageRanks) step(ctx context.Context, tokens []int32, phase model.Phase, head bool) ([]int32, error) {
	T := len(st.ms[0])
	batches := make([]*model.Batch, T)
	for t, m := range st.ms[0] {
		b, err := m.NewBatch([]*model.SeqState{st.seqs[0][t]}, [][]int32{tokens})
		if err != nil {
			return nil, err
		}
		batches[t] = b
	}
	var out []int32
	for s, ranks := range st.ms {
		if s > 0 {
			for t := range batches {
				batches[t] = handOn(batches[t], st.seqs[s][t])
			}
		}
		ids := make([]int32, T)
		err := eachRank(ranks, func(t int, m *model.Model) error {
			lo, hi := layerRange(m)
			if err := m.ForwardLayers(ctx, lo, hi, batches[t], phase); err != nil {
				return err
			}
			batches[t].Advance()
			if s < len(st.ms)-1 || !head {
				return nil
			}
			g, err := m.Greedy(ctx, batches[t])
			if err == nil {
				ids[t] = g[0]
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("stage %d: %w", s, err)
		}
		out = ids
	}
	return out, nil
}

// handOn gives the next stage's rank a batch of the same activations for
// its own state of the sequence.
func handOn(b *model.Batch, seq *model.SeqState) *model.Batch {
	return &model.Batch{Seqs: []*model.SeqState{seq}, Spans: b.Spans, Partial: b.Partial, Stack: b.Stack}
}

// layerRange is the resident layers of m.
func layerRange(m *model.Model) (lo, hi int) {
	lo = -1
	for L, l := range m.Layers {
		if l != nil {
			if lo < 0 {
				lo = L
			}
			hi = L + 1
		}
	}
	return lo, hi
}

// eachRank runs fn on every rank of a stage at once; a rank that fails
// leaves its stage's reductions, so that the others do not wait.
func eachRank(ranks []*model.Model, fn func(t int, m *model.Model) error) error {
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for t, m := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[t] = fn(t, m); errs[t] != nil {
				m.Reduce.(*model.LocalReducer).Close()
			}
		}()
	}
	wg.Wait()
	for t, err := range errs {
		if err != nil {
			return fmt.Errorf("tensor rank %d: %w", t, err)
		}
	}
	return nil
}

// generateStages is generate --pipeline P --tensor T in this process: the
// prompt but its last token prefilled, then greedy decode steps, as
// Model.Generate; every rank of the last stage must pick the same ids.
func generateStages(ctx context.Context, mf *modelFlags, n, P, T int) ([]int32, error) {
	ids, err := parseTokenIDs(mf.ids)
	if err != nil {
		return nil, err
	}
	st, closeAll, err := loadStages(mf, P, T)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	st.seqs = make([][]*model.SeqState, P)
	for s, ranks := range st.ms {
		for _, m := range ranks {
			lo, hi := layerRange(m)
			st.seqs[s] = append(st.seqs[s], m.NewState(lo, hi))
		}
	}
	if len(ids) > 1 {
		if _, err := st.step(ctx, ids[:len(ids)-1], model.PhasePrefill, false); err != nil {
			return nil, err
		}
	}
	var out []int32
	next := ids[len(ids)-1:]
	for len(out) < n {
		got, err := st.step(ctx, next, model.PhaseDecode, true)
		if err != nil {
			return nil, err
		}
		for t, id := range got {
			if id != got[0] {
				return nil, fmt.Errorf("last stage rank %d picked %d, rank 0 %d", t, id, got[0])
			}
		}
		out = append(out, got[0])
		next = got[:1]
	}
	return out, nil
}

// skipReduce is a Reducer that leaves the buffer as it is: a rank timed
// alone, its outputs wrong, its compute that of its share.
type skipReduce struct{}

func (skipReduce) AllReduce(context.Context, []float32) error { return nil }

// runComputeOnly times one rank's share of the decode steps alone, for
// tensor 1 and T, on one thread: what the split saves a rank with no
// other rank or exchange to wait for (the ids are not checked: without
// the reductions they are wrong).
func (tb *tensorBench) runComputeOnly(ctx context.Context) error {
	fmt.Printf("| tensor | seqs | rank 0 compute ms/step | vs tensor 1 |\n|---:|---:|---:|---:|\n")
	base := map[int]float64{}
	for _, T := range []int{1, tb.tensor} {
		m, err := model.Load(tb.mf.dir, cpu.New(max(tb.mf.threads, 1)), model.LoadOptions{Embed: true, Head: true, Shard: model.Shard{Rank: 0, Ranks: T}})
		if err != nil {
			return err
		}
		if m.State.LatentDType, err = model.ParseCacheDType(tb.mf.cache); err != nil {
			m.Close()
			return err
		}
		m.Reduce = skipReduce{}
		for _, n := range tb.seqs {
			r, err := decodeStage(ctx, m.Model, nil, n, tb.prompt, tb.tokens)
			if err != nil {
				m.Close()
				return err
			}
			if T == 1 {
				base[n] = r.StepMS
			}
			fmt.Printf("| %d | %d | %.1f | %.2fx |\n", T, n, r.StepMS, r.StepMS/base[n])
		}
		m.Close()
	}
	return nil
}
