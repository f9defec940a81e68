package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/bench/sim"
	"github.com/tandem-inference/tandem/bench/workload"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/internal/config"
	"github.com/tandem-inference/tandem/model/synth"
	"github.com/tandem-inference/tandem/tokenizer"
)

func init() {
	register(command{name: "e2e", short: "run the whole system here (NATS, coordinator, prefill worker, decode group) on a workload per policy, against the simulator's prediction", run: stages(parseE2EFlags, runE2E)})
}

// e2eConfig is bench e2e's configuration, from its flags.
type e2eConfig struct {
	model, preset, profile     string
	workload, trace            string
	ladder, warmupPrompts      string
	rate                       float64
	seed                       uint64
	policies                   string
	ranks, threads, seedTokens int
	threshold                  int
	budget, linkRate           string
	tolerance                  float64
	jobTimeout                 time.Duration
	warmup, probeReps, rounds  int
	out                        string
	asJSON, verbose            bool
	cacheCompare               bool
	cachePolicy                string
	chat, cacheInTurn          bool
	// --workload edit: jobs, passage words, reply tokens, and the
	// acceptance rates of the forced-draft runs.
	editJobs, editWords, editOutput int
	forced                          []float64
	args                            []string // the command line, for REPORT.md
}

// e2eOutput is the JSON line of bench e2e.
type e2eOutput struct {
	Model    string      `json:"model"`
	Workload e2eWorkload `json:"workload"`
	// The deployment: decode ranks, compute threads per service, the
	// prefill worker's budget, the link limit (0: loopback as is).
	Ranks         int   `json:"ranks"`
	Rounds        int   `json:"rounds"`
	Threads       int   `json:"threads"`
	PrefillBudget int64 `json:"prefill_budget_bytes"`
	LinkRate      int64 `json:"link_rate_bytes_per_s"`
	// Profile is the hardware profile the simulator ran with; SeedTokens
	// the prompt length the router's rates were seeded at (the coordinator
	// and the simulator start from the same rates).
	Profile    string `json:"profile"`
	SeedTokens int    `json:"seed_tokens"`
	// Policies are the measured figures per policy, each with the
	// simulator's prediction of its TTFT p50.
	Policies map[string]e2ePolicy `json:"policies"`
	// Predicted is the simulator's summary of the same jobs per policy,
	// with the threshold rule the coordinator does not offer.
	Predicted map[string]sim.Summary `json:"predicted"`
	// Probes are what the probe jobs measured on the idle system before
	// each replay (none with --probe 0).
	Probes []*e2eProbe `json:"probes,omitempty"`
	// Tolerance is the largest |predicted/measured - 1| of TTFT p50 the
	// calibration check accepts; CalibrationOK says whether every policy
	// is within it.
	Tolerance float64 `json:"tolerance"`
	// Threshold is the simulated threshold rule's prompt length.
	Threshold     int  `json:"threshold_tokens"`
	CalibrationOK bool `json:"calibration_ok"`
	// The prefix cache compared (agent workload): TTFT p50 of replays
	// under CachePolicy with the decode group's prefix cache on and off,
	// their ratio, and the share of the prompt tokens the cache served.
	CachePolicy string `json:"cache_policy,omitempty"`
	// CacheInTurn: the comparison's replays ran each job alone, in turn.
	CacheInTurn         bool    `json:"cache_in_turn,omitempty"`
	TTFTP50             float64 `json:"ttft_p50_s,omitempty"`
	TTFTP50NoCache      float64 `json:"ttft_p50_s_no_cache,omitempty"`
	CacheSpeedup        float64 `json:"cache_ttft_speedup,omitempty"`
	CacheHitTokensRatio float64 `json:"cache_hit_tokens_ratio,omitempty"`
	// Chat: the agent's turns were K3 chats (--chat), and
	// CacheHitTokensRatioIDs is the cache's share of the same jobs' prompt
	// tokens replayed as token ids of the same lengths (each session's
	// turns extending one another, no prefix shared across sessions).
	// ChatFraming is the chats' tokens before the first user message (the
	// tools, the thinking-effort and system messages), the same in every
	// session: each chat's turns are the workload's lengths plus these.
	Chat                   bool    `json:"chat,omitempty"`
	ChatFraming            int     `json:"chat_framing_tokens,omitempty"`
	CacheHitTokensRatioIDs float64 `json:"cache_hit_tokens_ratio_ids,omitempty"`
	TookS                  float64 `json:"took_s"`
	// LoadAverage is the machine's 1-minute load average over the whole
	// run, sampled (absent where it cannot be read): with 2 cores, 2 is
	// busy, and anything above is other work the figures shared them with.
	LoadAverage *loadAverage `json:"load_average,omitempty"`
	// PageFaults counts the process's minor page faults (first touches
	// of fresh memory, mostly) in the warm-up's cold jobs ("cold"), the
	// rest of the warm-up ("warmup") and each policy's replays, and
	// PageFaultUS is what one costs on this machine
	// (machine.PageFaultMicros): the one-time costs of a process's first
	// jobs, priced. Absent where they cannot be read.
	PageFaults  map[string]int64 `json:"page_faults,omitempty"`
	PageFaultUS float64          `json:"page_fault_us,omitempty"`
	Out         string           `json:"out,omitempty"`
}

type e2eWorkload struct {
	Name           string  `json:"name"`
	Jobs           int     `json:"jobs"`
	Sessions       int     `json:"sessions"`
	MedianPrompt   int     `json:"median_prompt_tokens"`
	MaxPrompt      int     `json:"max_prompt_tokens"`
	ArrivalsPerMin float64 `json:"arrivals_per_min"`
}

// e2ePolicy is one policy's measured summary and the prediction of its
// TTFT p50.
type e2ePolicy struct {
	sim.Summary
	PredictedP50 float64 `json:"predicted_ttft_p50_s"`
	// Ratio is predicted over measured TTFT p50; Within whether it is
	// within the tolerance.
	Ratio  float64 `json:"predicted_over_measured"`
	Within bool    `json:"within_tolerance"`
	// ProfileP50 is the prediction from the profile alone (without the
	// probe's figures), ProfileRatio its ratio to the measurement.
	ProfileP50   float64 `json:"profile_only_ttft_p50_s"`
	ProfileRatio float64 `json:"profile_only_over_measured"`
	// RoundP50 is each round's TTFT p50; OtherLoad the share of the
	// machine's cores other processes used during the replays, and
	// ProbeLoad during the probes before them (absent where unknown): a
	// prediction from a probe taken under another load than its replay's
	// is off by that much.
	RoundP50  []float64 `json:"round_ttft_p50_s"`
	OtherLoad *float64  `json:"other_load,omitempty"`
	ProbeLoad *float64  `json:"probe_other_load,omitempty"`
	// LoadAverage is the machine's 1-minute load average during the
	// replays, sampled.
	LoadAverage *loadAverage `json:"load_average,omitempty"`
	// CoordinatorP50 is the TTFT p50 by the coordinator's clock
	// (accepted to first token), without the client's hops.
	CoordinatorP50 float64 `json:"coordinator_ttft_p50_s"`
	// Failures lists why jobs did not complete (at most a few).
	Failures []string `json:"failures,omitempty"`
	// PredRatio*: each completed job's measured TTFT (the client's) over
	// the router's prediction for the path it took (its routed event),
	// as percentiles over the jobs; PredJobs the jobs themselves.
	PredRatioP10 float64      `json:"ttft_pred_ratio_p10"`
	PredRatioP50 float64      `json:"ttft_pred_ratio_p50"`
	PredRatioP90 float64      `json:"ttft_pred_ratio_p90"`
	PredJobs     []e2ePredJob `json:"pred_jobs,omitempty"`
	// PartResiduals sets the measured parts of those jobs' TTFT against
	// the router's predicted parts, part by part: where the model is wrong.
	PartResiduals []e2ePartResidual `json:"part_residuals,omitempty"`
}

// e2ePartResidual is one part of the TTFT over the jobs whose route
// carried predicted parts: the sums predicted and measured, and the median
// and the largest of measured less predicted per job.
type e2ePartResidual struct {
	Part        string  `json:"part"`
	Jobs        int     `json:"jobs"`
	PredictedS  float64 `json:"predicted_s"`
	MeasuredS   float64 `json:"measured_s"`
	ResidualP50 float64 `json:"residual_p50_s"`
	ResidualMax float64 `json:"residual_max_s"` // the largest in size, with its sign
}

// e2ePredJob is one job's predicted and measured TTFT, and its parts.
type e2ePredJob struct {
	Prompt     int       `json:"prompt_tokens"`
	Target     string    `json:"target"`
	PredictedS float64   `json:"predicted_ttft_s"`
	MeasuredS  float64   `json:"measured_ttft_s"`
	Ratio      float64   `json:"measured_over_predicted"`
	Parts      []e2ePart `json:"parts,omitempty"`
}

// e2ePart is one part of a job's TTFT, predicted and measured.
type e2ePart struct {
	Part       string  `json:"part"`
	PredictedS float64 `json:"predicted_s"`
	MeasuredS  float64 `json:"measured_s"`
}

// ttftParts sets a job's measured TTFT of took apart against the router's
// predicted parts, as far as the coordinator's timing marks tell them
// apart. Remote: queue (submission to the weight pass's start, against the
// wait for the running pass and the control plane's latency), pass (the
// prefill worker's pass), transfer tail (pass end to the state committed)
// and first step (the rest: the decode group's prefill of the tokens after
// a split, its first step and the hops to the client). Local: queue (submission to the decode group's start, the
// rest of the TTFT), and prefill (the group's prefill and first step, one
// figure in the timing). None without predicted parts or timing.
func ttftParts(rt *cp.RouteDecision, t *cp.Timing, took time.Duration) []e2ePart {
	if rt == nil || rt.Parts == nil || t == nil {
		return nil
	}
	p := rt.Parts
	part := func(name string, pred, got time.Duration) e2ePart {
		return e2ePart{Part: name, PredictedS: pred.Seconds(), MeasuredS: got.Seconds()}
	}
	if rt.Target == cp.TargetRemote {
		queue := t.Queue + t.PassWait
		first := max(0, took-queue-t.Prefill-t.TransferTail)
		return []e2ePart{part("queue", p.QueueWait+p.Overhead, queue), part("pass", p.Pass, t.Prefill),
			part("transfer_tail", p.TransferTail, t.TransferTail), part("first_step", p.Prefill+p.FirstStep, first)}
	}
	return []e2ePart{part("queue", p.QueueWait+p.Overhead, max(0, took-t.Prefill)), part("prefill", p.Prefill+p.FirstStep, t.Prefill)}
}

// partResiduals sums each part over the jobs.
func partResiduals(jobs []e2ePredJob) []e2ePartResidual {
	var out []e2ePartResidual
	res := map[string][]float64{}
	at := map[string]int{}
	for _, j := range jobs {
		for _, p := range j.Parts {
			i, ok := at[p.Part]
			if !ok {
				i = len(out)
				at[p.Part] = i
				out = append(out, e2ePartResidual{Part: p.Part})
			}
			r := &out[i]
			r.Jobs++
			r.PredictedS += p.PredictedS
			r.MeasuredS += p.MeasuredS
			d := p.MeasuredS - p.PredictedS
			if math.Abs(d) > math.Abs(r.ResidualMax) {
				r.ResidualMax = d
			}
			res[p.Part] = append(res[p.Part], d)
		}
	}
	for i := range out {
		out[i].ResidualP50 = sim.Percentile(res[out[i].Part], 50)
	}
	return out
}

// predRatios sets each completed job's measured TTFT against the router's
// prediction for the path it took.
func predRatios(pol *e2ePolicy, ms []measured) {
	var rs []float64
	for _, m := range ms {
		rt := m.Final.Route
		if m.Err != nil || rt == nil || m.FirstToken.IsZero() {
			continue
		}
		pred := rt.PredictedLocal
		if rt.Target == cp.TargetRemote {
			pred = rt.PredictedRemote
		}
		if pred <= 0 {
			continue // a rate was not measured yet: no prediction
		}
		got := m.FirstToken.Sub(m.Submitted)
		j := e2ePredJob{Prompt: m.Job.Prompt, Target: string(rt.Target), PredictedS: pred.Seconds(), MeasuredS: got.Seconds(), Ratio: got.Seconds() / pred.Seconds(),
			Parts: ttftParts(rt, m.Final.Timing, got)}
		pol.PredJobs = append(pol.PredJobs, j)
		rs = append(rs, j.Ratio)
	}
	if len(rs) > 0 {
		pol.PredRatioP10, pol.PredRatioP50, pol.PredRatioP90 = sim.Percentile(rs, 10), sim.Percentile(rs, 50), sim.Percentile(rs, 90)
	}
	pol.PartResiduals = partResiduals(pol.PredJobs)
}

// e2eRun is one policy's replay, kept for the report.
type e2eRun struct {
	policy    router.Policy
	perRound  int // jobs per round
	jobs      []measured
	measured  *sim.Result
	predicted *sim.Result
}

// parseE2EFlags parses bench e2e's command line. After --help it returns
// pflag.ErrHelp.
func parseE2EFlags(args []string) (e2eConfig, error) {
	f := e2eConfig{args: args}
	fs := pflag.NewFlagSet("e2e", pflag.ContinueOnError)
	fs.StringVar(&f.model, "model", "", "checkpoint directory (default: the --preset synthetic model, generated into the test-model cache if needed)")
	fs.StringVar(&f.preset, "preset", "tiny", "synthetic model preset when --model is not given (the one the profile was calibrated on)")
	fs.StringVar(&f.profile, "profile", "local", "hardware profile of this machine for the simulator (configs/hardware name or .yaml path; bench calibrate writes it)")
	fs.StringVar(&f.workload, "workload", "mix", "generated workload: mix (short and long prompts) or agent (growing sessions), at local scale (bench/workload LocalMix, LocalAgent), or ladder (the --ladder prompt lengths, each job alone, in turn: the router's predictions against each prompt's measured TTFT), or edit (jobs asking to rewrite a passage, each alone: decode tok/s with speculative decoding on and off, and with forced drafts at --forced-acceptance)")
	fs.IntVar(&f.editJobs, "edit-jobs", 6, "--workload edit: the jobs (each run in turn)")
	fs.IntVar(&f.editWords, "edit-words", 120, "--workload edit: words in each job's passage")
	fs.IntVar(&f.editOutput, "edit-output", 96, "--workload edit: tokens each reply may run to")
	fs.Float64SliceVar(&f.forced, "forced-acceptance", []float64{0, 0.5, 0.7, 0.9}, "--workload edit: acceptance rates of the forced-draft runs (the model's own reply, recorded without drafts, each drafted token wrong with probability 1-rate)")
	fs.StringVar(&f.ladder, "ladder", "64,256,1024,4096,16384", "--workload ladder: the prompt lengths, in tokens")
	fs.StringVar(&f.warmupPrompts, "warmup-prompts", "128,256,512", "prompt lengths of the warm-up jobs, each way, in turn (--warmup of them): what the workers fit their cost-model terms to before the replays")
	fs.StringVar(&f.trace, "trace", "", "replay this trace file (JSON Lines, see bench/workload) instead of a generated workload")
	fs.Float64Var(&f.rate, "rate", 0, "generated workload: jobs (mix) or sessions (agent) per minute (default 60 (mix) or 20 (agent))")
	fs.Uint64Var(&f.seed, "seed", 1, "generated workload: random seed")
	fs.StringVar(&f.policies, "policies", "local,remote,auto", "routing policies to replay the workload under (threshold is simulated only)")
	fs.IntVar(&f.ranks, "ranks", 0, "decode ranks (default: the profile's)")
	fs.IntVar(&f.threads, "threads", 0, "compute threads per service (default: the profile's)")
	fs.StringVar(&f.budget, "memory-budget", "", "prefill worker memory budget, a byte size (default: the profile's memory_budget)")
	config.Alias(fs, "budget", "memory-budget")
	fs.StringVar(&f.linkRate, "link-rate", "", "limit the link from the prefill worker to each decode rank to this many bytes per second, e.g. 50MB (default: loopback as is)")
	fs.IntVar(&f.threshold, "threshold", 1000, "prompt length above which the simulated threshold rule goes remote")
	fs.IntVar(&f.seedTokens, "seed-tokens", 1024, "prompt length at which the router's rates are seeded from the profile (coordinator and simulator alike)")
	fs.Float64Var(&f.tolerance, "tolerance", 0.25, "calibration check: largest accepted |predicted/measured - 1| of TTFT p50")
	fs.DurationVar(&f.jobTimeout, "job-timeout", 5*time.Minute, "longest a job may take from submission to its end")
	fs.IntVar(&f.warmup, "warmup", 2, "jobs each way (local, remote) to warm the services before the replays, after a throwaway cold one each way of the longest --warmup-prompts (a worker's fit drops its first prefill, and the process's first jobs pay for the memory its heap first touches)")
	fs.IntVar(&f.rounds, "rounds", 1, "replay the workload this many times per policy, the policies in turn (a shared machine's load varies over minutes)")
	fs.IntVar(&f.probeReps, "probe", 3, "probe the idle system before each replay, each probe job this many times (0: predict from the profile alone)")
	fs.StringVar(&f.out, "out", "", "write charts (PNG) and REPORT.md into this directory")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object as the last line")
	fs.BoolVar(&f.verbose, "v", false, "log the services (to stderr)")
	fs.BoolVar(&f.cacheCompare, "cache-compare", true, "with --workload agent: also replay the workload under --cache-policy with the decode group's prefix cache off and on (--rounds times each) and report both TTFT p50s")
	fs.StringVar(&f.cachePolicy, "cache-policy", "local", "routing policy of the prefix cache comparison (the decode group holds the cache)")
	fs.BoolVar(&f.cacheInTurn, "cache-in-turn", false, "the prefix cache comparison replays the jobs in turn, each when the one before ended: the share of the prompt tokens the cache serves as the prompts allow, whatever the machine's load (with arrivals, a turn that comes before the one before it was prefilled misses)")
	fs.BoolVar(&f.chat, "chat", false, "with --workload agent: build each session's turns as K3 chats (thinking on, tools declared, each reply with its reasoning and a tool call, then the tool's result) rendered by the model's tokenizer at about the workload's lengths; the cache comparison also replays token ids of the same lengths")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench e2e [flags]

Starts the whole system on this machine, as separate machines would run it
but in one process: an embedded NATS server with JetStream, the coordinator,
a CPU prefill worker and a decode group, each on its own NATS connection,
the state moving over kvtransfer on loopback (optionally rate-limited). It
replays a workload (a trace, or the generated mix of short and long prompts,
or agent sessions of growing prompts) once per routing policy, each job
submitted at its arrival time through the control plane, and reports per
policy: TTFT p50/p95/p99 (submission sent to first token received), decode
tok/s, jobs per minute, jobs per weight pass, state bytes moved and the
transfer tail left after the pass. The coordinator starts each replay from
the rates of the hardware profile, and the simulator runs the same jobs:
its TTFT p50 per policy is printed next to the measured one, and checked
against --tolerance.

Before each replay, probe jobs (single prompts of a few lengths, each way,
on the idle system) measure what bench calibrate cannot see from its
isolated measurements: the control plane's latency on each path, the prefill
worker's compute inside its weight passes, the decode group's prefill and
step, as deployed here and as loaded by whatever else runs on the machine
at the time. The replay is predicted from the profile with these figures;
the profile alone is reported next to it.

`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return f, nil
}

// validate checks the flags that need no file, profile or model: the
// policies, the numbers, the prompt lengths, --link-rate and the flags
// that go together.
func (f e2eConfig) validate() error {
	if _, err := e2ePolicies(f.policies); err != nil {
		return err
	}
	switch {
	case f.jobTimeout <= 0:
		return fmt.Errorf("--job-timeout %v: want a positive duration", f.jobTimeout)
	case !(f.tolerance > 0):
		return fmt.Errorf("--tolerance %v: want a positive fraction", f.tolerance)
	case f.seedTokens < 2:
		return fmt.Errorf("--seed-tokens %d: want at least 2", f.seedTokens)
	case f.threshold < 1:
		return fmt.Errorf("--threshold %d: want a prompt length of at least 1", f.threshold)
	case f.rounds < 1:
		return fmt.Errorf("--rounds %d: want at least 1", f.rounds)
	case f.warmup < 0 || f.ranks < 0 || f.threads < 0 || f.probeReps < 0:
		return errors.New("--warmup, --probe, --ranks and --threads may not be negative")
	case f.workload == "edit" && (f.editJobs < 1 || f.editWords < 4 || f.editOutput < 2):
		return fmt.Errorf("--workload edit: --edit-jobs %d, --edit-words %d, --edit-output %d: want at least 1, 4 and 2", f.editJobs, f.editWords, f.editOutput)
	case f.workload == "edit" && slices.ContainsFunc(f.forced, func(a float64) bool { return !(a >= 0 && a <= 1) }):
		return fmt.Errorf("--forced-acceptance %v: want rates in [0, 1]", f.forced)
	case f.chat && (f.workload != "agent" || f.trace != ""):
		return fmt.Errorf("--chat builds the agent workload's sessions as chats: want --workload agent without --trace (not %q)", f.workload)
	}
	if _, err := f.linkBytesPerS(); err != nil {
		return err
	}
	if f.inTurn() {
		if _, _, err := ladderJobs(f.ladder); err != nil {
			return err
		}
	}
	if _, err := intList(f.warmupPrompts, "--warmup-prompts"); err != nil {
		return err
	}
	if f.comparesCache() {
		return cachePolicyOK(router.Policy(f.cachePolicy))
	}
	return nil
}

// inTurn says whether the workload is the ladder, its jobs replayed in
// turn.
func (f e2eConfig) inTurn() bool { return f.workload == "ladder" && f.trace == "" }

// comparesCache says whether the run compares the prefix cache off and on
// (the generated agent workload with --cache-compare).
func (f e2eConfig) comparesCache() bool {
	return f.cacheCompare && f.workload == "agent" && f.trace == ""
}

// linkBytesPerS is --link-rate in bytes per second (0: not limited).
func (f e2eConfig) linkBytesPerS() (int64, error) {
	if f.linkRate == "" {
		return 0, nil
	}
	rate, err := config.ParseBytes(f.linkRate)
	if err != nil || rate <= 0 {
		return 0, fmt.Errorf("--link-rate %q: want a positive byte rate such as 50MB (per second)", f.linkRate)
	}
	return rate, nil
}

// e2eBench is one bench e2e run: its inputs, loaded, the system it
// started, and what it gathers.
type e2eBench struct {
	cfg        e2eConfig
	policies   []router.Policy
	prof       *sim.Profile
	dir        string // the checkpoint
	budget     int64  // the prefill worker's, in bytes
	rate       int64  // the link's limit, bytes per second (0: none)
	setup      sim.Setup
	seed       router.Rates
	jobs       []workload.Job
	warmLens   []int
	out        e2eOutput
	d          *deployment
	nc         *nats.Conn
	vocab      int
	key        string // the jobs' key prefix, unique per run
	faults     *faultCounter
	probeLoads map[router.Policy][]*float64
	runs       int                  // edit jobs run, for their keys
	draftCfg   pipeline.DraftConfig // the decode group's
}

func runE2E(ctx context.Context, f e2eConfig) error {
	start := time.Now()
	loadAll := sampleLoad(loadEvery)
	defer loadAll.Stop()
	r, err := loadE2E(ctx, f)
	if err != nil {
		return err
	}
	if err := r.startSystem(ctx); err != nil {
		return err
	}
	defer r.close()
	if err := r.warmUp(ctx); err != nil {
		return err
	}
	if f.workload == "edit" {
		out, err := r.runEdit(ctx)
		if err != nil {
			return err
		}
		return r.writeEdit(out, start, loadAll)
	}
	runs, err := r.replayPolicies(ctx)
	if err != nil {
		return err
	}
	if f.comparesCache() {
		if err := compareCache(ctx, r.d, r.nc, r.jobs, router.Policy(f.cachePolicy), f.rounds, r.vocab, r.key, f.jobTimeout, f.chat, f.cacheInTurn, &r.out); err != nil {
			return err
		}
	}
	return r.write(start, loadAll, runs)
}

// loadE2E loads the profile, sizes the deployment by it and the flags,
// loads the model (generating the synthetic one if needed) and builds the
// workload.
func loadE2E(ctx context.Context, f e2eConfig) (*e2eBench, error) {
	r := &e2eBench{cfg: f, probeLoads: map[router.Policy][]*float64{}}
	var err error
	if r.policies, err = e2ePolicies(f.policies); err != nil {
		return nil, err
	}
	if r.prof, err = sim.LoadProfile(f.profile); err != nil {
		return nil, err
	}
	if err := r.sizeDeployment(); err != nil {
		return nil, err
	}
	name, err := r.loadModel(ctx)
	if err != nil {
		return nil, err
	}
	c := &r.cfg
	r.out = e2eOutput{Model: name, Chat: c.chat, Ranks: c.ranks, Rounds: c.rounds, Threads: c.threads, PrefillBudget: r.budget, LinkRate: r.rate, Profile: r.prof.Name,
		SeedTokens: c.seedTokens, Policies: map[string]e2ePolicy{}, Predicted: map[string]sim.Summary{}, Tolerance: c.tolerance, Threshold: c.threshold, CalibrationOK: true}
	if err := r.loadWorkload(); err != nil {
		return nil, err
	}
	return r, nil
}

// sizeDeployment sets the deployment's ranks, threads, budget and link
// from the profile unless the flags say otherwise; the simulator is given
// what is deployed (r.setup, less its model).
func (r *e2eBench) sizeDeployment() error {
	f, prof := &r.cfg, r.prof
	if prof.Prefill == nil || prof.Decode == nil || prof.Link == nil {
		return fmt.Errorf("--profile %s: want a profile of this machine with prefill, decode and link sections (bench calibrate writes one)", f.profile)
	}
	pre, dec, link := *prof.Prefill, *prof.Decode, *prof.Link
	if f.threads == 0 {
		f.threads = max(pre.Threads, 1)
	}
	if f.ranks == 0 {
		f.ranks = dec.Ranks
	}
	if f.ranks != dec.Ranks {
		say("e2e: warning: %d decode ranks, the profile %s was measured with %d: its decode figures may not hold", f.ranks, prof.Name, dec.Ranks)
		dec.Ranks = f.ranks
	}
	if f.budget != "" {
		pre.MemoryBudget = f.budget
	}
	var err error
	if r.budget, err = pre.Budget(); err != nil {
		return fmt.Errorf("--memory-budget: %w", err)
	}
	if r.rate, err = f.linkBytesPerS(); err != nil {
		return err
	}
	if r.rate > 0 {
		// One proxy per rank: each rank's connections get the rate.
		link.GBps, link.PerRank = min(link.GBps, float64(r.rate)/1e9), true
	}
	r.setup = sim.Setup{Name: prof.Name, Prefill: &pre, Decode: &dec, Link: &link, Control: prof.ControlPlane}
	return nil
}

// loadModel finds the checkpoint (the synthetic --preset one without
// --model, generated if needed), loads its shapes into the setup and
// returns the model's name for the report.
func (r *e2eBench) loadModel(ctx context.Context) (string, error) {
	f := &r.cfg
	r.dir = f.model
	if r.dir == "" {
		say("e2e: synthetic %s model (cache %s)", f.preset, synth.CacheDir())
		var err error
		if r.dir, err = synth.Ensure(ctx, synth.CacheDir(), f.preset, 1, 0); err != nil {
			return "", err
		}
	}
	if cal := r.prof.Measured["model"]; cal != "" && filepath.Base(cal) != filepath.Base(r.dir) {
		say("e2e: warning: the profile %s was calibrated on %s, this run serves %s", r.prof.Name, filepath.Base(cal), filepath.Base(r.dir))
	}
	m, err := sim.LoadModel(r.dir)
	if err != nil {
		return "", err
	}
	name := f.preset
	if f.model != "" {
		name = m.Name
	}
	r.setup.Model = m
	return name, r.setup.Validate()
}

// loadWorkload builds the jobs (the ladder, a trace or the generated
// workload, as K3 chats with --chat) and the warm-up's prompt lengths.
func (r *e2eBench) loadWorkload() error {
	f := &r.cfg
	var wname string
	var err error
	switch {
	case f.workload == "edit" && f.trace == "":
		tok, err := tokenizer.Load(r.dir)
		if err != nil {
			return fmt.Errorf("--workload edit: the model's tokenizer: %w", err)
		}
		r.jobs, err = editJobs(tok, f.editJobs, f.editWords, f.editOutput, f.seed)
		wname = "edit"
		if err != nil {
			return err
		}
	case f.inTurn():
		r.jobs, wname, err = ladderJobs(f.ladder)
	default:
		r.jobs, wname, err = simWorkload(simConfig{workload: f.workload, trace: f.trace, rate: f.rate, seed: f.seed}, "local")
	}
	if err != nil {
		return err
	}
	if f.chat {
		tok, err := tokenizer.Load(r.dir)
		if err != nil {
			return fmt.Errorf("--chat: the model's tokenizer: %w", err)
		}
		if r.jobs, r.out.ChatFraming, err = agentChats(tok, r.jobs); err != nil {
			return err
		}
		wname += fmt.Sprintf(", as K3 chats (thinking on, tools, tool results; %d tokens of framing added)", r.out.ChatFraming)
	}
	if r.warmLens, err = intList(f.warmupPrompts, "--warmup-prompts"); err != nil {
		return err
	}
	ws := workload.Summarize(r.jobs)
	r.out.Workload = e2eWorkload{Name: wname, Jobs: ws.Jobs, Sessions: ws.Sessions, MedianPrompt: ws.MedianPrompt, MaxPrompt: ws.MaxPrompt,
		ArrivalsPerMin: ws.ArrivalsPerMin}
	return nil
}

// startSystem starts NATS, the coordinator, the prefill worker and the
// decode ranks, the coordinator's rates seeded from the setup, and
// connects the client.
func (r *e2eBench) startSystem(ctx context.Context) error {
	f := &r.cfg
	log := zap.NewNop()
	if f.verbose {
		var err error
		if log, err = config.NewLogger("debug", "console", os.Stderr); err != nil {
			return err
		}
	}
	say("e2e: starting NATS, the coordinator, a prefill worker and %d decode ranks (%s, %d thread(s) each)", f.ranks, r.out.Model, f.threads)
	r.seed = sim.SeedRates(r.setup, f.seedTokens)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	// The edit workload's jobs run again and again: a prefix cache's
	// session index would draft each reply from its own earlier run.
	cache := pipeline.PrefixCacheConfig{Off: f.workload == "edit"}
	d, err := startDeployment(sctx, deployOptions{ModelDir: r.dir, Ranks: f.ranks, Threads: f.threads, PrefillBudget: r.budget, LinkRate: r.rate,
		Rates: r.seed, Draft: r.draftCfg, PrefixCache: cache, Log: log})
	cancel()
	if err != nil {
		return fmt.Errorf("e2e: starting the system: %w", err)
	}
	r.d = d
	// The replay watches the prefill worker's reports too: the
	// coordinator's identity (a client may not read them).
	if r.nc, err = d.c.ConnectAs(ctx, cp.PrincipalCoordinator, "e2e-client"); err != nil {
		d.Close()
		r.d = nil
		return err
	}
	r.vocab = d.c.Model.VocabSize
	nonce := make([]byte, 6)
	_, _ = rand.Read(nonce)
	r.key = "e2e-" + hex.EncodeToString(nonce)
	return nil
}

// close closes the client's connection, then the system.
// It may be called again: the edit workload restarts the system.
func (r *e2eBench) close() {
	if r.nc != nil {
		r.nc.Close()
	}
	if r.d != nil {
		r.d.Close()
	}
	r.nc, r.d = nil, nil
}

// warmUp runs the warm-up jobs and counts their page faults.
func (r *e2eBench) warmUp(ctx context.Context) error {
	f := &r.cfg
	warm := time.Now()
	r.faults = newFaultCounter()
	if err := e2eWarmup(ctx, r.d, r.nc, f.warmup, r.warmLens, r.vocab, r.key, f.jobTimeout, r.faults); err != nil {
		return err
	}
	if f.warmup > 0 && len(r.warmLens) > 0 {
		say("e2e: the warm-up took %s%s", report.Duration(time.Since(warm).Seconds()), r.faults.String())
	}
	return nil
}

// predict is the simulator's run of the jobs on s under policy p, the
// router seeded as the coordinator was.
func (r *e2eBench) predict(ctx context.Context, s sim.Setup, p router.Policy) (*sim.Result, error) {
	return sim.Run(ctx, s, r.jobs, sim.Options{Policy: p, Seed: &r.seed, Threshold: r.cfg.threshold})
}

// probe is the setup the replay under p in round is predicted with: the
// profile's with what the probe jobs measure just before it (the profile
// alone with --probe 0).
func (r *e2eBench) probe(ctx context.Context, p router.Policy, round int) (sim.Setup, error) {
	f := &r.cfg
	if f.probeReps == 0 {
		return r.setup, nil
	}
	say("e2e: probing the idle system (prompts of %v tokens, %d times each way)", probeLengths, f.probeReps)
	probed, pr, err := runProbe(ctx, r.d, r.nc, r.setup, f.probeReps, r.vocab, fmt.Sprintf("%s-probe-%s-%d", r.key, p, round), f.jobTimeout)
	if err != nil {
		return sim.Setup{}, err
	}
	pr.Policy, pr.Round = string(p), round+1
	r.out.Probes = append(r.out.Probes, pr)
	r.probeLoads[p] = append(r.probeLoads[p], pr.OtherLoad)
	say("e2e: probe: control plane %.2f ms local, %.2f ms remote; prefill worker's passes %.2fx the profile's compute time (worst residual %.0f%%); decode group's prefill %.2fx (worst error %.0f%%), step %.2f ms",
		pr.ControlPlane.LocalMS, pr.ControlPlane.RemoteMS, pr.PrefillFactor, 100*pr.PrefillFit.Residual, pr.GroupFactor, 100*pr.GroupFit.Residual, pr.DecodeStepMS)
	return probed, nil
}

// replayPolicies replays the jobs under each policy, --rounds times, each
// replay probed and predicted, and sets each policy's measurements against
// the predictions; then predicts the threshold rule on the same jobs.
func (r *e2eBench) replayPolicies(ctx context.Context) ([]e2eRun, error) {
	f := &r.cfg
	probe := func(p router.Policy, round int) (sim.Setup, error) { return r.probe(ctx, p, round) }
	predict := func(s sim.Setup, p router.Policy) (*sim.Result, error) { return r.predict(ctx, s, p) }
	done, err := replayRounds(ctx, r.d, r.nc, r.jobs, r.policies, f.rounds, r.vocab, r.key, f.jobTimeout, f.inTurn(), probe, predict)
	if err != nil {
		return nil, err
	}
	var runs []e2eRun
	for _, p := range r.policies {
		po, err := r.predict(ctx, r.setup, p)
		if err != nil {
			return nil, err
		}
		run, pol := summarizePolicy(p, done[p], po, f.tolerance)
		pol.ProbeLoad = meanLoad(r.probeLoads[p])
		for _, x := range done[p] {
			if x.faultsKnown {
				r.faults.add(string(p), x.faults)
			}
		}
		runs = append(runs, run)
		r.out.CalibrationOK = r.out.CalibrationOK && pol.Within
		r.out.Policies[string(p)] = pol
		r.out.Predicted[string(p)] = sim.Summarize(run.predicted)
		say("e2e: policy %s: TTFT p50 %s measured, %s predicted (x%.2f; profile alone %s, x%.2f); %d of %d jobs completed",
			p, report.Duration(pol.TTFTP50), report.Duration(pol.PredictedP50), pol.Ratio, report.Duration(pol.ProfileP50), pol.ProfileRatio, pol.Completed, pol.Jobs)
	}
	// The rule the coordinator does not offer, on the same jobs (with the
	// first replay's probe).
	first := r.setup
	for _, x := range done[r.policies[0]][:1] {
		first = x.setup
	}
	tr, err := r.predict(ctx, first, router.Threshold)
	if err != nil {
		return nil, err
	}
	r.out.Predicted[string(router.Threshold)] = sim.Summarize(tr)
	return runs, nil
}

// write prints the tables, finishes the output (time taken, page faults,
// load average), writes the report with --out and the JSON line with
// --json.
func (r *e2eBench) write(start time.Time, loadAll *loadSampler, runs []e2eRun) error {
	f, out := &r.cfg, &r.out
	tables := e2eTables(out, runs)
	for _, t := range tables {
		if err := t.Write(os.Stdout); err != nil {
			return err
		}
		fmt.Println()
	}
	out.TookS = time.Since(start).Seconds()
	out.PageFaults, out.PageFaultUS = r.faults.counts(), r.faults.us
	if a, ok := loadAll.Stop(); ok {
		out.LoadAverage = &a
		say("e2e: took %s, the machine's load average %s (mean (min-max) over the run, %d cores)", report.Duration(out.TookS), a, runtime.NumCPU())
	}
	if f.out != "" {
		if err := e2eReport(f.out, out, tables, runs, f.args); err != nil {
			return err
		}
		out.Out = f.out
		say("e2e: charts and REPORT.md in %s", f.out)
	}
	if f.asJSON {
		return report.JSONLine(os.Stdout, *out)
	}
	return nil
}

// cachePolicyOK checks --cache-policy: a policy the coordinator offers.
func cachePolicyOK(policy router.Policy) error {
	switch policy {
	case router.Local, router.Remote, router.Auto:
		return nil
	}
	return fmt.Errorf("--cache-policy %q: want local, remote or auto", policy)
}

func e2ePolicies(s string) ([]router.Policy, error) {
	var out []router.Policy
	seen := map[router.Policy]bool{}
	for _, p := range splitList(s) {
		switch pol := router.Policy(p); pol {
		case router.Local, router.Remote, router.Auto:
			if !seen[pol] {
				out = append(out, pol)
				seen[pol] = true
			}
		case router.Threshold:
			return nil, errors.New("--policies: threshold is not a coordinator policy; bench e2e reports its simulated figures on the same jobs")
		default:
			return nil, fmt.Errorf("--policies: unknown policy %q (local, remote, auto)", p)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("--policies: no policy")
	}
	return out, nil
}

// e2eWarmup runs a few jobs each way, so that the replays do not pay for
// first-use costs (page faults, buffers, connections) the simulator does
// not model.
func e2eWarmup(ctx context.Context, d *deployment, nc *nats.Conn, n int, lens []int, vocab int, key string, timeout time.Duration, faults *faultCounter) error {
	if n == 0 || len(lens) == 0 {
		return nil
	}
	cold := slices.Max(lens)
	say("e2e: warming up (a cold job of %d tokens each way, then %d jobs each way, in turn, prompts of %v tokens)", cold, n, lens)
	// A worker's first prefill pays the process's one-time costs and its
	// fit lets it go when the second comes (costmodel.Fitter). Both cold
	// jobs go first, and long ones: the process's first jobs run up to
	// 1.6x slower while its heap grows into memory touched for the first
	// time (page_faults in the JSON), and samples from them priced short
	// prompts up to 1.6x long (BENCHMARKS, router section).
	warm := func(p cp.Policy, jobs []workload.Job) error {
		ms, _, err := replay(ctx, nc, jobs, p, vocab, key+"-warm", timeout, true)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if m.Err != nil {
				return fmt.Errorf("e2e: warm-up job (%s): %w", p, m.Err)
			}
		}
		return nil
	}
	both := []cp.Policy{cp.PolicyLocal, cp.PolicyRemote}
	for _, p := range both {
		if err := warm(p, []workload.Job{{ID: fmt.Sprintf("warm-%s-cold", p), Prompt: cold, Output: 8}}); err != nil {
			return err
		}
	}
	faults.mark("cold")
	for _, p := range both {
		var jobs []workload.Job
		for i := range n {
			jobs = append(jobs, workload.Job{ID: fmt.Sprintf("warm-%s-%d", p, i), Prompt: lens[i%len(lens)], Output: 8})
		}
		if err := warm(p, jobs); err != nil {
			return err
		}
	}
	faults.mark("warmup")
	d.takePasses()
	return nil
}

// coordinatorP50 is the TTFT p50 by the coordinator's own timing.
func coordinatorP50(ms []measured) float64 {
	var xs []float64
	for _, m := range ms {
		if m.Err == nil && m.Final.Timing != nil {
			xs = append(xs, m.Final.Timing.FirstToken.Seconds())
		}
	}
	return sim.Percentile(xs, 50)
}

// replayed is one replay of the workload under a policy, with its
// prediction and the setup it was predicted with.
type replayed struct {
	ms    []measured
	res   *sim.Result
	pred  *sim.Result
	setup sim.Setup
	// others is the share of the machine other processes used meanwhile
	// (known false where it cannot be read), load the load average.
	others float64
	known  bool
	load   loadAverage
	// faults are the process's minor page faults during the replay
	// (faultsKnown false where they cannot be read).
	faults      int64
	faultsKnown bool
}

// replayRounds replays the jobs under every policy, rounds times, the
// coordinator's cost model started afresh before each replay (not for jobs
// in turn, the ladder); probe gives
// the setup each replay is predicted with, predict the prediction.
func replayRounds(ctx context.Context, d *deployment, nc *nats.Conn, jobs []workload.Job, policies []router.Policy, rounds, vocab int,
	key string, timeout time.Duration, inTurn bool, probe func(router.Policy, int) (sim.Setup, error),
	predict func(sim.Setup, router.Policy) (*sim.Result, error)) (map[router.Policy][]replayed, error) {
	span := time.Duration(0)
	if n := len(jobs); n > 0 {
		span = jobs[n-1].Arrival
	}
	done := map[router.Policy][]replayed{}
	for round := range rounds {
		for i := range policies {
			p := policies[(i+round)%len(policies)] // each round starts with the next policy
			ps, err := probe(p, round)
			if err != nil {
				return nil, err
			}
			pred, err := predict(ps, p)
			if err != nil {
				return nil, err
			}
			// A replay's router starts afresh from the seed rates, as the
			// simulator's does; but the ladder (jobs in turn) measures the
			// router's own predictions after the warm-up, and a restart
			// would drop what the warm-up taught it that the workers do not
			// advertise (each path's control-plane overhead, the decode
			// step, the link): its first job would be priced without them.
			if !inTurn {
				if err := d.resetRouter(ctx); err != nil {
					return nil, err
				}
			}
			if err := d.setCache(ctx, true); err != nil {
				return nil, err
			}
			say("e2e: round %d, policy %s: replaying %d jobs over %s", round+1, p, len(jobs), report.Duration(span.Seconds()))
			lm, la := startLoad(), sampleLoad(loadEvery)
			f0, fok := minorFaults()
			began := time.Now()
			ms, t0, err := replay(ctx, nc, jobs, cp.Policy(p), vocab, fmt.Sprintf("%s-%s-%d", key, p, round), timeout, inTurn)
			r := replayed{ms: ms, pred: pred, setup: ps}
			r.load, _ = la.Stop()
			if f1, ok := minorFaults(); ok && fok {
				r.faults, r.faultsKnown = f1-f0, true
			}
			if err != nil {
				return nil, err
			}
			r.res = measuredResult(p, t0, ms, d.takePasses())
			r.others, r.known = lm.Others()
			done[p] = append(done[p], r)
			sum := sim.Summarize(r.res)
			load := ""
			if r.known {
				load = fmt.Sprintf("; other processes used %.0f%% of the machine", 100*r.others)
			}
			if r.load.Samples > 0 {
				load += fmt.Sprintf("; load average %s", r.load)
			}
			if r.faultsKnown {
				load += fmt.Sprintf("; %d page faults", r.faults)
			}
			say("e2e: round %d, policy %s: TTFT p50 %s, %d of %d jobs completed in %s%s", round+1, p, report.Duration(sum.TTFTP50), sum.Completed, sum.Jobs,
				report.Duration(time.Since(began).Seconds()), load)
		}
	}
	return done, nil
}

// summarizePolicy joins a policy's replays and their predictions, and sets
// them against each other and against the profile-only prediction (po).
func summarizePolicy(p router.Policy, rs []replayed, po *sim.Result, tolerance float64) (e2eRun, e2ePolicy) {
	var all []measured
	var results, preds []*sim.Result
	var others float64
	var la loadAverage
	known := true
	for _, r := range rs {
		la.merge(r.load)
		all = append(all, r.ms...)
		results = append(results, r.res)
		preds = append(preds, r.pred)
		others += r.others / float64(len(rs))
		known = known && r.known
	}
	mr, pr := mergeResults(results), mergeResults(preds)
	var pol e2ePolicy
	pol.Summary, pol.PredictedP50, pol.ProfileP50 = sim.Summarize(mr), sim.Summarize(pr).TTFTP50, sim.Summarize(po).TTFTP50
	pol.CoordinatorP50 = coordinatorP50(all)
	predRatios(&pol, all)
	if known {
		pol.OtherLoad = &others
	}
	if la.Samples > 0 {
		pol.LoadAverage = &la
	}
	for _, r := range results {
		pol.RoundP50 = append(pol.RoundP50, sim.Summarize(r).TTFTP50)
	}
	for _, m := range all {
		if m.Err != nil && len(pol.Failures) < 5 {
			pol.Failures = append(pol.Failures, fmt.Sprintf("%s: %v", m.Job.ID, m.Err))
		}
	}
	if pol.TTFTP50 > 0 {
		pol.Ratio, pol.ProfileRatio = pol.PredictedP50/pol.TTFTP50, pol.ProfileP50/pol.TTFTP50
	}
	pol.Within = pol.Completed > 0 && math.Abs(pol.Ratio-1) <= tolerance
	perRound := 0
	if len(rs) > 0 {
		perRound = len(rs[0].ms)
	}
	return e2eRun{policy: p, jobs: all, measured: mr, predicted: pr, perRound: perRound}, pol
}

// meanLoad is the mean of known loads (nil if any is unknown or none).
func meanLoad(xs []*float64) *float64 {
	if len(xs) == 0 {
		return nil
	}
	var t float64
	for _, x := range xs {
		if x == nil {
			return nil
		}
		t += *x / float64(len(xs))
	}
	return &t
}

// ladderJobs is the ladder workload: one job per prompt length, 4 tokens
// out, replayed in turn.
func ladderJobs(list string) ([]workload.Job, string, error) {
	lens, err := intList(list, "--ladder")
	if err != nil {
		return nil, "", err
	}
	var jobs []workload.Job
	for i, n := range lens {
		if n < 2 {
			return nil, "", fmt.Errorf("--ladder: a prompt of %d tokens: want at least 2", n)
		}
		jobs = append(jobs, workload.Job{ID: fmt.Sprintf("ladder-%d-%d", i, n), Prompt: n, Output: 4})
	}
	return jobs, fmt.Sprintf("ladder of prompts %v, each alone", lens), nil
}

// intList parses a comma-separated list of positive integers.
func intList(s, flagName string) ([]int, error) {
	var out []int
	for _, x := range splitList(s) {
		n, err := strconv.Atoi(x)
		if err != nil || n < 1 || n > 1<<20 {
			return nil, fmt.Errorf("%s: %q is not a prompt length (1 to %d)", flagName, x, 1<<20)
		}
		out = append(out, n)
	}
	return out, nil
}

// compareCache replays the jobs under policy with the decode group's
// prefix cache off and then on (each replay cold: every rank's cache
// emptied, the router started afresh), rounds times, and records both TTFT
// p50s, their ratio and the share of prompt tokens the cache served. With
// ids, each round also replays the jobs with the cache on as token ids of
// the same lengths (withoutTokens), and records that share too. inTurn
// replays each job when the one before ended.
func compareCache(ctx context.Context, d *deployment, nc *nats.Conn, jobs []workload.Job, policy router.Policy, rounds, vocab int,
	key string, timeout time.Duration, ids, inTurn bool, out *e2eOutput) error {
	if err := cachePolicyOK(policy); err != nil {
		return err
	}
	results := map[bool][]*sim.Result{}
	var cached, prompt, idsCached, idsPrompt int
	for round := range rounds {
		if ids {
			if err := d.resetRouter(ctx); err != nil {
				return err
			}
			if err := d.setCache(ctx, true); err != nil { // emptied: cold
				return err
			}
			ms, _, err := replay(ctx, nc, withoutTokens(jobs), cp.Policy(policy), vocab, fmt.Sprintf("%s-cacheids-%d", key, round), timeout, inTurn)
			if err != nil {
				return err
			}
			var c, p int
			for _, m := range ms {
				if m.Err != nil {
					return fmt.Errorf("e2e: cache comparison (token ids): %s: %w", m.Job.ID, m.Err)
				}
				c += m.Final.Timing.CachedTokens
				p += m.Job.Prompt
			}
			idsCached, idsPrompt = idsCached+c, idsPrompt+p
			say("e2e: prefix cache on, token ids of the chats' lengths, policy %s, round %d: %.1f%% of the prompt tokens from it", policy, round+1, 100*float64(c)/float64(p))
		}
		for _, on := range []bool{false, true} {
			if err := d.resetRouter(ctx); err != nil {
				return err
			}
			if err := d.setCache(ctx, on); err != nil {
				return err
			}
			ms, t0, err := replay(ctx, nc, jobs, cp.Policy(policy), vocab, fmt.Sprintf("%s-cache%v-%d", key, on, round), timeout, inTurn)
			if err != nil {
				return err
			}
			r := measuredResult(policy, t0, ms, d.takePasses())
			results[on] = append(results[on], r)
			for _, m := range ms {
				if m.Err != nil {
					return fmt.Errorf("e2e: cache comparison (cache on: %v): %s: %w", on, m.Job.ID, m.Err)
				}
				if on {
					cached += m.Final.Timing.CachedTokens
					prompt += m.Job.Prompt
				}
			}
			say("e2e: prefix cache %s, policy %s, round %d: TTFT p50 %s", map[bool]string{true: "on", false: "off"}[on], policy, round+1,
				report.Duration(sim.Summarize(r).TTFTP50))
		}
	}
	if err := d.setCache(ctx, true); err != nil {
		return err
	}
	out.CachePolicy, out.CacheInTurn = string(policy), inTurn
	out.TTFTP50 = sim.Summarize(mergeResults(results[true])).TTFTP50
	out.TTFTP50NoCache = sim.Summarize(mergeResults(results[false])).TTFTP50
	if out.TTFTP50 > 0 {
		out.CacheSpeedup = out.TTFTP50NoCache / out.TTFTP50
	}
	if prompt > 0 {
		out.CacheHitTokensRatio = float64(cached) / float64(prompt)
	}
	if idsPrompt > 0 {
		out.CacheHitTokensRatioIDs = float64(idsCached) / float64(idsPrompt)
		say("e2e: prefix cache: %.1f%% of the chats' prompt tokens came from it, %.1f%% as token ids of the same lengths",
			100*out.CacheHitTokensRatio, 100*out.CacheHitTokensRatioIDs)
	}
	say("e2e: prefix cache: TTFT p50 %s with it, %s without (x%.2f); %.0f%% of the prompt tokens came from it",
		report.Duration(out.TTFTP50), report.Duration(out.TTFTP50NoCache), out.CacheSpeedup, 100*out.CacheHitTokensRatio)
	return nil
}
