package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/decode-worker/group"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/model"
)

func init() {
	register(command{name: "decodegroup", short: "decode tok/s of a decode group, in process or as decode-worker processes: sequences x layouts, compute vs collective vs mesh time", run: runDecodeGroup})
}

// groupOptions maps the model tools' flags onto an in-process group of
// ranks, tensor of them per pipeline stage.
func groupOptions(mf *modelFlags, ranks, tensor int) (group.Options, error) {
	opt := group.Options{ModelDir: mf.dir, Ranks: ranks, Tensor: tensor, Threads: mf.threads, LatentNormEps: mf.latentEps}
	dt, err := model.ParseCacheDType(mf.cache)
	if err != nil {
		return opt, fmt.Errorf("--cache-dtype: %w", err)
	}
	opt.LatentDType = dt
	return opt, nil
}

// generateGroup is generate --pipeline P --tensor T (or --draft lookup):
// the prompt is prefilled and decoded greedily by a decode group of P
// stages of T tensor ranks in this process (each rank with its own
// kvtransfer server on loopback, the mesh and the stages' collectives over
// TCP), drafting when draft says so.
func generateGroup(ctx context.Context, mf *modelFlags, n, stages, tensor int, draft bool) ([]int32, error) {
	if mf.dir == "" || mf.ids == "" {
		return nil, errors.New("--model and --ids are required")
	}
	ids, err := parseTokenIDs(mf.ids)
	if err != nil {
		return nil, err
	}
	opt, err := groupOptions(mf, stages*tensor, tensor)
	if err != nil {
		return nil, err
	}
	opt.Draft.Off = !draft
	g, err := group.Start(ctx, opt)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	out, err := g.Generate(ctx, "generate", ids, n)
	if st := g.Head().Stats(); draft && err == nil {
		fmt.Fprintf(os.Stderr, "draft: %d tokens in %d decode steps; %d drafted, %d accepted\n", st.Tokens, st.DecodeSteps, st.DraftedTokens, st.AcceptedTokens)
	}
	return out, err
}

func runDecodeGroup(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("decodegroup", pflag.ContinueOnError)
	var mf modelFlags
	fs.StringVar(&mf.dir, "model", "", "checkpoint directory (required)")
	fs.IntVar(&mf.threads, "threads", 0, "CPU threads per rank (0: all; with --tensor or --processes, 0 is 1)")
	fs.StringVar(&mf.cache, "cache-dtype", "bf16", "MLA latent cache dtype: bf16 or f32")
	rankList := fs.String("ranks", "1,2,3", "group sizes to measure")
	seqList := fs.String("seqs", "1,4,8,16", "concurrent sequences to measure (with --tensor or --processes the default is 1,16)")
	tokens := fs.Int("tokens", 32, "tokens generated per sequence (with --tensor or --processes: measured per sequence after 2 warm-up tokens, default 48; the prompts are admitted a step or so apart, and only the steps that decode all of them count)")
	promptLen := fs.Int("prompt", 8, "prompt length of each sequence")
	micro := fs.Int("micro-batches", 0, "steps in flight (0: the number of pipeline stages)")
	minRatio := fs.Float64("min-ratio", 2, "fail unless the largest group's tok/s at the most sequences is at least this multiple of its single-sequence tok/s (0: no check)")
	pipe := fs.Int("pipeline", 0, "pipeline stages: the same as --ranks with one size")
	tensor := fs.Int("tensor", 1, "tensor ranks per pipeline stage: above 1 (or with --processes), the real decode pipeline of --pipeline stages of this many ranks against one rank (1 x 1) in the same run, on the same sequences, failing unless the first sequence's greedy ids agree")
	transport := fs.String("transport", "tcp", "with --tensor: every link of the group (mesh and the stages' collectives), tcp (loopback) or rdma-fake (the RDMA link on the in-process fake verbs wire; ranks in this process)")
	processes := fs.Bool("processes", false, "with --tensor: each rank a decode-worker process with GOMAXPROCS 1 and one compute thread, rank r pinned to CPU r mod the CPUs (linux); without it the ranks run in this process with --threads threads each (at least 1)")
	worker := fs.String("decode-worker", "", "with --processes: the decode-worker binary (default: beside bench, else built from the module in the working directory, else on $PATH)")
	forced := fs.Float64("forced-acceptance", -1, "speculative decoding with a forced drafter: it proposes the model's own continuation (from a run without drafts) with each token wrong with probability 1-P; reports tok/s with it and without drafts, measured in the same run on the same group (-1: off)")
	asJSON := fs.Bool("json", false, "with --forced-acceptance or --tensor: print the results as JSON (--tensor: one object per run with pipeline, tensor, sequences, tok_s, ms_per_step, compute_ms_per_step, collective_ms_per_step, queued_ms_per_step, ratio_vs_1x1, ...)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if mf.dir == "" {
		return errors.New("--model is required")
	}
	if *tensor < 1 {
		return fmt.Errorf("--tensor %d: want 1 or more ranks per stage", *tensor)
	}
	layouts := *tensor > 1 || *processes
	if layouts && !fs.Changed("seqs") {
		*seqList = "1,16"
	}
	if layouts && !fs.Changed("tokens") {
		*tokens = 48
	}
	ss, err := parseCountList(*seqList)
	if err != nil {
		return fmt.Errorf("--seqs: %w", err)
	}
	if *tokens < 4 || *promptLen < 1 {
		return errors.New("--tokens must be at least 4 and --prompt at least 1")
	}
	if layouts && (fs.Changed("forced-acceptance") || fs.Changed("min-ratio") || fs.Changed("ranks")) {
		return errors.New("--forced-acceptance, --min-ratio and --ranks measure plain pipelines: leave them out with --tensor or --processes")
	}
	if layouts {
		lb := layoutBench{mf: &mf, pipeline: max(*pipe, 1), tensor: *tensor, processes: *processes, seqs: ss, prompt: *promptLen,
			tokens: *tokens, micro: *micro, json: *asJSON, transport: *transport, worker: *worker}
		return lb.run(ctx)
	}
	if *pipe > 0 {
		*rankList = strconv.Itoa(*pipe)
	}
	rs, err := parseCountList(*rankList)
	if err != nil {
		return fmt.Errorf("--ranks: %w", err)
	}
	if *forced != -1 {
		if !(*forced >= 0 && *forced <= 1) {
			return fmt.Errorf("--forced-acceptance %v: want a probability in [0, 1]", *forced)
		}
		return runForced(ctx, &mf, rs, ss, *promptLen, *tokens, *micro, *forced, *asJSON)
	}
	return ranksTable(ctx, &mf, rs, ss, *promptLen, *tokens, *micro, *minRatio)
}

// ranksTable is decodegroup --ranks: each group size in this process at
// each number of sequences, and the aggregate rate's check.
func ranksTable(ctx context.Context, mf *modelFlags, rs, ss []int, promptLen, tokens, micro int, minRatio float64) error {
	fmt.Printf("| ranks | seqs | tok/s | ms/step | compute ms/step | mesh ms/step | queued ms/step | seqs/step |\n")
	fmt.Printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	rate := map[[2]int]float64{}
	for _, r := range rs {
		opt, err := groupOptions(mf, r, 1)
		if err != nil {
			return err
		}
		opt.MicroBatches = micro
		g, err := group.Start(ctx, opt)
		if err != nil {
			return err
		}
		for _, s := range ss {
			res, err := measureDecode(ctx, g, s, promptLen, tokens)
			if err != nil {
				g.Close()
				return fmt.Errorf("%d ranks, %d sequences: %w", r, s, err)
			}
			rate[[2]int{r, s}] = res.tokPerSec
			fmt.Printf("| %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", r, s, res.tokPerSec,
				durMS(res.step), durMS(res.compute), durMS(res.mesh), durMS(res.step-res.compute-res.mesh), res.rowsPerStep)
		}
		g.Close()
	}
	rmax, smax, smin := rs[len(rs)-1], ss[len(ss)-1], ss[0]
	if base := rate[[2]int{rmax, smin}]; base > 0 {
		ratio := rate[[2]int{rmax, smax}] / base
		fmt.Printf("\n%d ranks: %d sequences give %.2fx the tok/s of %d (limit %.2fx)\n", rmax, smax, ratio, smin, minRatio)
		if b1 := rate[[2]int{rs[0], smin}]; b1 > 0 {
			fmt.Printf("%d ranks x %d sequences vs %d rank x %d sequence: %.2fx\n", rmax, smax, rs[0], smin, rate[[2]int{rmax, smax}]/b1)
		}
		if minRatio > 0 && ratio < minRatio {
			return fmt.Errorf("aggregate tok/s ratio %.2f is below the limit %.2f", ratio, minRatio)
		}
	}
	return nil
}

type decodeResult struct {
	tokPerSec           float64
	step, compute, mesh time.Duration // per decode step
	rowsPerStep         float64
}

// measureDecode submits seqs sequences at once (concurrently, as a control
// plane with many jobs does) and measures the aggregate rate: every token
// delivered, over the time from the submissions to the last end. The step
// breakdown comes from the head's counters over the run.
func measureDecode(ctx context.Context, g *group.Group, seqs, promptLen, tokens int) (decodeResult, error) {
	return measureDecodeKeep(ctx, g, seqs, promptLen, tokens, nil)
}

// measureDecodeKeep is measureDecode that, with keep, hands each prompt and
// the tokens it got to keep afterwards.
func measureDecodeKeep(ctx context.Context, g *group.Group, seqs, promptLen, tokens int, keep func(prompt, out []int32)) (decodeResult, error) {
	vocab := g.Model(0).Cfg.VocabSize
	sink := &timedSink{done: make(chan struct{}), left: seqs}
	prompts := map[string][]int32{}
	if keep != nil {
		sink.toks = map[string][]int32{}
	}
	before := g.Head().Stats()
	start := time.Now()
	errs := make(chan error, seqs)
	for i := 0; i < seqs; i++ {
		p := benchPrompt(i, promptLen, vocab)
		id := fmt.Sprintf("bench-%d-%d", start.UnixNano(), i)
		prompts[id] = p
		go func() {
			errs <- g.Head().Submit(ctx, pipeline.Request{ID: id, Tokens: p, MaxTokens: tokens, Sink: sink})
		}()
	}
	for i := 0; i < seqs; i++ {
		if err := <-errs; err != nil {
			return decodeResult{}, err
		}
	}
	select {
	case <-sink.done:
	case <-ctx.Done():
		return decodeResult{}, ctx.Err()
	}
	elapsed := time.Since(start)
	if sink.err != nil {
		return decodeResult{}, sink.err
	}
	after := g.Head().Stats()
	for id, p := range prompts {
		if keep != nil {
			keep(p, sink.toks[id])
		}
	}
	res := decodeResult{tokPerSec: float64(sink.tokens) / elapsed.Seconds()}
	if steps := after.DecodeSteps - before.DecodeSteps; steps > 0 {
		res.step = (after.StepTime - before.StepTime) / time.Duration(steps)
		res.compute = (after.StepComputeTime - before.StepComputeTime) / time.Duration(steps)
		res.mesh = (after.StepMeshTime - before.StepMeshTime) / time.Duration(steps)
		res.rowsPerStep = float64(after.DecodeRows-before.DecodeRows) / float64(steps)
	}
	return res, nil
}

// timedSink counts tokens and ends.
type timedSink struct {
	mu     sync.Mutex
	toks   map[string][]int32 // by sequence, when kept
	tokens int
	left   int
	err    error
	done   chan struct{}
}

func (s *timedSink) Token(seq string, _ int, t int32) {
	s.mu.Lock()
	s.tokens++
	if s.toks != nil {
		s.toks[seq] = append(s.toks[seq], t)
	}
	s.mu.Unlock()
}

func (s *timedSink) End(seq string, r pipeline.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Reason != pipeline.ReasonLength && s.err == nil {
		s.err = fmt.Errorf("sequence %s ended early: %s %v", seq, r.Reason, r.Err)
	}
	if s.left--; s.left == 0 {
		close(s.done)
	}
}

func durMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func parseCountList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, v)
	}
	return out, nil
}
