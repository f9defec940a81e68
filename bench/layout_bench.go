package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/frontdoor"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/model"
)

// layoutBench is decodegroup --pipeline P --tensor T (or --processes): the
// real decode pipeline of P stages of T tensor ranks against one rank, in
// this process (group.Start) or as decode-worker processes of one core
// each. Both are driven the same way, through rank 0's front door, and
// measured from the head's Stats over a window that leaves out the prefill
// and the first decode steps.
type layoutBench struct {
	mf               *modelFlags
	pipeline, tensor int
	processes        bool
	seqs             []int
	prompt, tokens   int
	micro            int
	json             bool
	// transport is "tcp" or "rdma-fake": every link of the group (the
	// mesh and the stages' collectives) on the RDMA link over the
	// in-process fake verbs wire.
	transport string
	// worker is the decode-worker binary (--processes; empty: found or
	// built by run, see decodeWorkerBinary).
	worker string
	vocab  int // the model's, read by check
}

// warmTokens are the tokens of each sequence left out of the measured
// window, after its prefill: the first decode steps, which grow buffers and
// caches.
const warmTokens = 2

// layoutRun is the head's figures for one layout and number of sequences.
type layoutRun struct {
	Pipeline     int     `json:"pipeline"`
	Tensor       int     `json:"tensor"`
	Sequences    int     `json:"sequences"`
	Processes    bool    `json:"processes"`
	Transport    string  `json:"transport"`
	TokS         float64 `json:"tok_s"`
	StepMS       float64 `json:"ms_per_step"`
	ComputeMS    float64 `json:"compute_ms_per_step"`    // the ranks' compute but their reductions
	CollectiveMS float64 `json:"collective_ms_per_step"` // the tensor stages' reductions
	QueuedMS     float64 `json:"queued_ms_per_step"`     // step time minus compute: mesh hops and queueing
	MeshMS       float64 `json:"mesh_ms_per_step"`       // of which the mesh hops
	SeqsPerStep  float64 `json:"seqs_per_step"`
	Reductions   float64 `json:"reductions_per_step"` // rank 0's all-reduces
	Steps        int64   `json:"steps"`
	Ratio        float64 `json:"ratio_vs_1x1"` // tok/s against one rank's at the same sequences
	IDs          []int32 `json:"-"`            // the first sequence's greedy ids
}

// check validates the flags against the model before anything starts.
func (lb *layoutBench) check() error {
	switch {
	case lb.transport != "tcp" && lb.transport != "rdma-fake":
		return fmt.Errorf("--transport %q: want tcp or rdma-fake", lb.transport)
	case lb.transport == "rdma-fake" && lb.processes:
		return fmt.Errorf("--transport rdma-fake runs the ranks in this process (the fake verbs wire is in memory); leave out --processes")
	case lb.pipeline < 1 || lb.tensor < 1:
		return fmt.Errorf("--pipeline %d --tensor %d: want 1 or more of each", lb.pipeline, lb.tensor)
	}
	c, err := model.LoadConfig(filepath.Join(lb.mf.dir, "config.json"))
	if err != nil {
		return err
	}
	if err := c.CheckShard(lb.tensor); err != nil {
		return fmt.Errorf("--tensor %d: %w", lb.tensor, err)
	}
	lb.vocab = c.VocabSize
	if lb.pipeline > c.NumLayers {
		return fmt.Errorf("--pipeline %d: the model has %d layers to split into stages", lb.pipeline, c.NumLayers)
	}
	return nil
}

// run measures one rank, then the layout, on the same sequences, checks
// that the first sequence's ids agree and prints the runs.
func (lb *layoutBench) run(ctx context.Context) error {
	if err := lb.check(); err != nil {
		return err
	}
	if lb.processes {
		bin, cleanup, err := decodeWorkerBinary(ctx, lb.worker)
		if err != nil {
			return err
		}
		defer cleanup()
		lb.worker = bin
	}
	if !lb.json {
		fmt.Printf("| pipeline | tensor | seqs | tok/s | ms/step | compute ms/step | collective ms/step | queued ms/step | seqs/step | reductions/step | vs 1x1 |\n")
		fmt.Printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	one, err := lb.measure(ctx, 1, 1)
	if err != nil {
		return fmt.Errorf("1 x 1: %w", err)
	}
	lb.print(one)
	if lb.pipeline == 1 && lb.tensor == 1 {
		return nil
	}
	runs, err := lb.measure(ctx, lb.pipeline, lb.tensor)
	if err != nil {
		return fmt.Errorf("%d x %d: %w", lb.pipeline, lb.tensor, err)
	}
	for i := range runs {
		runs[i].Ratio = runs[i].TokS / one[i].TokS
		if !slices.Equal(runs[i].IDs, one[i].IDs) {
			return fmt.Errorf("%d sequences: pipeline %d x tensor %d generated %v for the first sequence, one rank %v",
				runs[i].Sequences, lb.pipeline, lb.tensor, runs[i].IDs, one[i].IDs)
		}
	}
	lb.print(runs)
	if !lb.json {
		fmt.Printf("\ngreedy ids of %d x %d equal one rank's at every number of sequences\n", lb.pipeline, lb.tensor)
	}
	return nil
}

func (lb *layoutBench) print(runs []layoutRun) {
	for _, r := range runs {
		if lb.json {
			b, _ := json.Marshal(r)
			fmt.Println(string(b))
			continue
		}
		fmt.Printf("| %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.0f | %.2fx |\n", r.Pipeline, r.Tensor, r.Sequences,
			r.TokS, r.StepMS, r.ComputeMS, r.CollectiveMS, r.QueuedMS, r.SeqsPerStep, r.Reductions, r.Ratio)
	}
}

// measure starts a group of P x T ranks and measures every number of
// sequences on it.
func (lb *layoutBench) measure(ctx context.Context, P, T int) ([]layoutRun, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		head *frontdoor.Client
		stop func()
		err  error
	)
	if lb.processes {
		head, stop, err = lb.startProcesses(ctx, P, T)
	} else {
		head, stop, err = lb.startInProcess(ctx, P, T)
	}
	if err != nil {
		return nil, err
	}
	defer stop()
	var out []layoutRun
	for _, n := range lb.seqs {
		r, err := lb.window(ctx, head, n)
		if err != nil {
			return nil, fmt.Errorf("%d sequences: %w", n, err)
		}
		r.Pipeline, r.Tensor, r.Processes, r.Transport, r.Ratio = P, T, lb.processes, lb.transport, 1
		out = append(out, r)
	}
	return out, nil
}

// window submits n sequences at once and measures them while all n
// decode together: from the moment each has its warm-up tokens (its
// prefill and first steps done) to the moment the first ends (the prompts
// are admitted one after another, so they end one after another too): tok/s
// on the wall clock, the step split from the head's counters. Both ends are
// the head's snapshots as they come back to the bench, so that their delays
// (a rank on one busy core answers late) cancel out.
func (lb *layoutBench) window(ctx context.Context, head *frontdoor.Client, n int) (layoutRun, error) {
	base, err := head.Stats(ctx)
	if err != nil {
		return layoutRun{}, err
	}
	streams := make([]*frontdoor.Stream, n)
	for i := range streams {
		id := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i)
		if streams[i], err = head.Submit(ctx, frontdoor.Request{ID: id, Tokens: benchPrompt(i, lb.prompt, lb.vocab), MaxTokens: warmTokens + lb.tokens}); err != nil {
			return layoutRun{}, err
		}
	}
	for _, s := range streams {
		if _, err := s.WaitTokens(ctx, warmTokens); err != nil {
			return layoutRun{}, err
		}
	}
	before, err := head.Stats(ctx)
	start := time.Now()
	if err != nil {
		return layoutRun{}, err
	}
	if err := firstDone(ctx, streams); err != nil {
		return layoutRun{}, err
	}
	// The stream's end can come a moment before the head's snapshot
	// counts it.
	after, end, err := pollStats(ctx, head, func(st frontdoor.Stats) bool { return st.Finished+st.Failed > base.Finished+base.Failed })
	if err != nil {
		return layoutRun{}, err
	}
	var ids []int32
	for i, s := range streams {
		got, res, err := s.Wait(ctx)
		if err != nil {
			return layoutRun{}, err
		}
		if res.Reason != pipeline.ReasonLength {
			return layoutRun{}, fmt.Errorf("sequence %d ended early: %s %s", i, res.Reason, res.Err)
		}
		if i == 0 {
			ids = got
		}
	}
	return stepSplit(before.Stats, after.Stats, n, end.Sub(start), ids)
}

// firstDone waits until one of the streams ends.
func firstDone(ctx context.Context, streams []*frontdoor.Stream) error {
	done := make(chan struct{}, len(streams))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, s := range streams {
		go func() {
			select {
			case <-s.Done():
				done <- struct{}{}
			case <-wctx.Done():
			}
		}()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// statsPoll is how often pollStats reads the head's counters.
const statsPoll = 2 * time.Millisecond

// pollStats reads the head's snapshot until done says so, and returns it
// with the time it came.
func pollStats(ctx context.Context, head *frontdoor.Client, done func(frontdoor.Stats) bool) (frontdoor.Stats, time.Time, error) {
	for {
		st, err := head.Stats(ctx)
		now := time.Now()
		if err != nil || done(st) {
			return st, now, err
		}
		select {
		case <-time.After(statsPoll):
		case <-ctx.Done():
			return st, now, ctx.Err()
		}
	}
}

// stepSplit is the run's figures from the head's counters before and
// after the window.
func stepSplit(before, after pipeline.Stats, n int, elapsed time.Duration, ids []int32) (layoutRun, error) {
	steps := after.DecodeSteps - before.DecodeSteps
	if steps <= 0 {
		return layoutRun{}, fmt.Errorf("no decode step of all %d sequences together was measured (the first ended before the last had its first tokens): give more --tokens", n)
	}
	per := func(d time.Duration) float64 { return durMS(d) / float64(steps) }
	compute, coll := after.StepComputeTime-before.StepComputeTime, after.StepCollectiveTime-before.StepCollectiveTime
	step := after.StepTime - before.StepTime
	return layoutRun{Sequences: n, Steps: steps, IDs: ids,
		TokS:         float64(after.Tokens-before.Tokens) / elapsed.Seconds(),
		StepMS:       per(step),
		ComputeMS:    per(compute - coll),
		CollectiveMS: per(coll),
		QueuedMS:     per(step - compute),
		MeshMS:       per(after.StepMeshTime - before.StepMeshTime),
		SeqsPerStep:  float64(after.DecodeRows-before.DecodeRows) / float64(steps),
		Reductions:   float64(after.Reductions-before.Reductions) / float64(steps),
	}, nil
}

// benchPrompt is sequence i's prompt of n tokens.
func benchPrompt(i, n, vocab int) []int32 {
	p := make([]int32, n)
	for j := range p {
		p[j] = int32((i*7919 + j*104729 + 13) % vocab)
	}
	return p
}
