package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/bench/workload"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
)

// Setup is the cluster a simulation runs: a model, a decode group, and
// optionally a prefill box with the link to the group.
type Setup struct {
	Name    string
	Model   *Model
	Prefill *PrefillBox // nil: the decode group alone
	Decode  *DecodeGroup
	Link    *Link // required with Prefill
	// Control is the control plane's latency (nil: none).
	Control *ControlPlane
}

// Validate checks that the setup can run.
func (s Setup) Validate() error {
	switch {
	case s.Model == nil:
		return errors.New("sim: setup has no model")
	case s.Decode == nil:
		return fmt.Errorf("sim: setup %s has no decode group", s.Name)
	case s.Prefill != nil && s.Link == nil:
		return fmt.Errorf("sim: setup %s has a prefill box but no link to the decode group", s.Name)
	}
	if s.Prefill != nil {
		if err := s.Prefill.validate(); err != nil {
			return fmt.Errorf("sim: setup %s: prefill: %w", s.Name, err)
		}
	}
	if s.Link != nil {
		if err := s.Link.validate(); err != nil {
			return fmt.Errorf("sim: setup %s: link: %w", s.Name, err)
		}
	}
	if err := s.Decode.validate(); err != nil {
		return fmt.Errorf("sim: setup %s: decode: %w", s.Name, err)
	}
	if s.Control != nil {
		if err := s.Control.validate(); err != nil {
			return fmt.Errorf("sim: setup %s: control plane: %w", s.Name, err)
		}
	}
	return nil
}

// Options choose the routing policy and the services' parameters.
type Options struct {
	Policy router.Policy
	// Threshold is the Threshold policy's prompt length (default 1000, the
	// usual disaggregation rule).
	Threshold int
	// SeedTokens is the prompt length at which the router's rates are
	// seeded from the profiles (default 8192); Alpha the estimator's weight
	// of each measurement (router.NewEstimator; 0: its default).
	SeedTokens int
	Alpha      float64
	// Seed, if set, are the router's starting rates instead (those a real
	// coordinator was configured with, to replay what it did).
	Seed *router.Rates
	// SinkQueue is each job's queue of layer states (the scheduler's
	// default, 4, when 0).
	SinkQueue int
	// MaxEvents bounds a run (default 10 million).
	MaxEvents int
}

func (o Options) withDefaults() Options {
	if o.Policy == "" {
		o.Policy = router.Auto
	}
	if o.Threshold <= 0 {
		o.Threshold = 1000
	}
	if o.SeedTokens <= 0 {
		o.SeedTokens = 8192
	}
	if o.SinkQueue <= 0 {
		o.SinkQueue = 4
	}
	if o.MaxEvents <= 0 {
		o.MaxEvents = 10_000_000
	}
	return o
}

// JobResult is how one job went. Arrival, FirstToken and Done are times
// since the workload's start; the others are spans, with Queue + Prefill +
// TransferTail + FirstStep = TTFT. A measured job's parts can add up to
// more, as bench e2e reports them as the coordinator marked them. The
// control plane's latency and a remote job's wait for the decode group's
// admission are part of Queue.
type JobResult struct {
	ID, Session string
	Turn        int
	Prompt      int
	Output      int
	Arrival     time.Duration
	Target      router.Target
	Decision    router.Decision
	// Refused is why the job did not run, or "" when it did.
	Refused string
	// Queue runs from arrival to the first remote pass or the first local
	// prefill chunk, and Prefill from there to the end of the last pass or
	// chunk. TransferTail, remote only, runs from the end of the last pass
	// to the state's commit on the group, and FirstStep from then to the
	// first token, the wait for the group's next decode step and the step.
	Queue, Prefill, TransferTail, FirstStep, TTFT time.Duration
	Passes                                        int
	FirstToken, Done                              time.Duration
	// Bytes is the state moved over the link.
	Bytes int64
}

// PassResult is one weight pass.
type PassResult struct {
	Index                             int
	Start, End                        time.Duration
	Jobs, Tokens, Depth, Tile         int
	Read, Compute, ReadWait, SinkWait time.Duration
	Bytes                             int64
}

// Result is a simulation run.
type Result struct {
	Setup  string
	Policy router.Policy
	Jobs   []JobResult
	Passes []PassResult
	// End is when the last job finished.
	End time.Duration
	// LinkBytes and LinkBusy total the data plane's use.
	LinkBytes int64
	LinkBusy  time.Duration
	// Seed and Final are the router's rates before and after the run.
	Seed, Final router.Rates
}

// SeedRates are the router's starting rates for a setup, from its
// profiles: the pass floor is a pass's read time, the compute terms are the
// profiles' (the decode group's measured rate points as terms, see
// groupRates). seedTokens is unused since the cost model prices every
// prompt length by its terms; it is kept for the callers' flags.
func SeedRates(s Setup, seedTokens int) router.Rates {
	_ = seedTokens
	var r router.Rates
	g := s.Decode
	r.DecodeStep = seconds(g.DecodeStepMS / 1e3)
	r.Local = groupRates(g, s.Model)
	if s.Prefill != nil {
		for _, d := range readTimes(s) {
			r.PassFloor += d
		}
		r.Prefill = withOverhead(s.Prefill.Compute, s.Prefill.LayerOverheadMS)
		r.LinkBytesPerS = s.Link.GBps * 1e9
		r.LinkRTT = seconds(s.Link.RTTUS / 1e6)
	}
	return r
}

func chunkOf(g *DecodeGroup) int {
	if g.PrefillChunk > 0 {
		return g.PrefillChunk
	}
	return 512
}

// readTimes is each layer's read on the prefill box.
func readTimes(s Setup) []time.Duration {
	out := make([]time.Duration, len(s.Model.Layers))
	rate := s.Prefill.ReadBytesPerS()
	lat := seconds(s.Prefill.ReadLatencyMS / 1e3)
	for L, l := range s.Model.Layers {
		out[L] = lat + seconds(float64(l.ReadBytes)/rate)
	}
	return out
}

// layerCompute is layer L's compute over a pass's pieces on the prefill box.
func layerCompute(s Setup, L int, pieces []planner.Piece) time.Duration {
	var f FLOPs
	for _, p := range pieces {
		f = f.Add(LayerFLOPs(s.Model.Cfg, L, p.Lo, p.Hi))
	}
	return withOverhead(s.Prefill.Compute, s.Prefill.LayerOverheadMS).Time(f, 1)
}

// Run simulates the jobs on the setup under opt.Policy.
func Run(ctx context.Context, s Setup, jobs []workload.Job, opt Options) (*Result, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := workload.Validate(jobs); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	opt = opt.withDefaults()
	c := newCluster(s, opt)
	for i := range jobs {
		j := &simJob{w: jobs[i], total: jobs[i].Prompt - 1}
		c.loop.At(j.w.Arrival, func() { c.arrive(j) })
		c.jobs = append(c.jobs, j)
	}
	if err := c.loop.Run(ctx, opt.MaxEvents); err != nil {
		return nil, err
	}
	res := &Result{Setup: s.Name, Policy: opt.Policy, Passes: c.passes, LinkBytes: c.link.Bytes, LinkBusy: c.link.Busy,
		Seed: c.seed, Final: c.est.Rates()}
	for _, j := range c.jobs {
		r := j.res
		if r.Refused == "" && r.TTFT == 0 && j.emitted == 0 {
			r.Refused = "did not finish (the simulation ran out of events)"
		}
		res.End = max(res.End, r.Done)
		res.Jobs = append(res.Jobs, r)
	}
	return res, nil
}

// simJob is a job's state in the simulation.
type simJob struct {
	w     workload.Job
	res   JobResult
	total int // tokens to prefill: the prompt less its last token
	done  int // prefilled so far

	// Remote: started once its first pass began; the end of its last pass.
	started bool
	start   time.Duration
	passEnd time.Duration
	// Group: tokens generated, when its state was ready for the first step.
	emitted  int
	ready    time.Duration
	reserved int64
	// Of its group prefill steps, the time in the MLA attention, which
	// the group times apart as the pipeline does.
	attention time.Duration
}

type cluster struct {
	s    Setup
	opt  Options
	loop Loop
	est  *router.Estimator
	seed router.Rates
	jobs []*simJob

	// The prefill box: its per-layer read times, planner costs and budget;
	// the scheduler's queues (scheduler.go's waiting and progress lists,
	// and jobs whose states are still going out).
	reads      []time.Duration
	costs      planner.Costs
	budget     int64
	waiting    []*simJob
	progress   []*simJob
	committing []*simJob
	running    bool
	runEnd     time.Duration
	inPass     map[*simJob]int // tokens of each job in the running pass
	passes     []PassResult
	link       LinkState

	// The decode group: local prefill queue (served in turn, a chunk at a
	// time), jobs waiting for their first step, jobs decoding; steps and
	// chunks alternate while both have work. Remote jobs wait in admitting
	// for the end of the group's step in flight: the group admits a
	// sequence (every rank reserves its state) between steps.
	cost        groupCost
	gq          []*simJob
	admitting   []*simJob
	readyQ      []*simJob
	decoding    []*simJob
	groupBusy   bool
	lastPrefill bool
	memFree     int64 // -1: unbounded
}

func newCluster(s Setup, opt Options) *cluster {
	c := &cluster{s: s, opt: opt, inPass: map[*simJob]int{}, cost: newGroupCost(s.Decode, s.Model), memFree: -1}
	c.seed = SeedRates(s, opt.SeedTokens)
	if opt.Seed != nil {
		c.seed = *opt.Seed
	}
	c.est = router.NewEstimator(c.seed, opt.Alpha)
	if n := s.Decode.StateBytes(); n > 0 {
		c.memFree = n
	}
	if s.Prefill != nil {
		c.reads = readTimes(s)
		c.costs = s.Model.Costs(s.Prefill.Threads)
		c.budget, _ = s.Prefill.Budget()
		c.link = LinkState{BytesPerS: s.Link.GBps * 1e9, RTT: seconds(s.Link.RTTUS / 1e6)}
		if s.Link.PerRank {
			c.link.Lane = rankLanes(len(s.Model.Layers), s.Decode.Ranks)
		}
	}
	return c
}

// load is the moment's queue state as the coordinator knows it: the
// running pass's remaining time (the worker reports its ETA layer by
// layer), the tokens waiting for the next pass, and the group's backlog of
// admitted local prefills at the estimated rate.
func (c *cluster) load() router.Load {
	l := router.Load{PrefillUp: c.s.Prefill != nil, Threshold: c.opt.Threshold}
	now := c.loop.Now()
	if c.running {
		l.PassRunning, l.PassRemaining = true, max(0, c.runEnd-now)
	}
	for _, j := range c.waiting {
		l.NextPass = append(l.NextPass, j.total-j.done)
	}
	for _, j := range c.progress {
		if n := j.total - j.done - c.inPass[j]; n > 0 {
			l.NextPass = append(l.NextPass, n)
		}
	}
	for _, j := range c.gq {
		l.LocalQueue = append(l.LocalQueue, j.total-j.done)
	}
	l.LocalChunk = chunkOf(c.s.Decode)
	return l
}

func (c *cluster) refuse(j *simJob, why string) {
	j.res.Refused = why
	if j.reserved > 0 {
		c.memFree += j.reserved
		j.reserved = 0
	}
}

func (c *cluster) arrive(j *simJob) {
	now := c.loop.Now()
	j.res = JobResult{ID: j.w.ID, Session: j.w.Session, Turn: j.w.Turn, Prompt: j.w.Prompt, Output: j.w.Output, Arrival: now}
	d := router.Route(c.opt.Policy, c.s.Model.Cost, c.est.Rates(), c.load(), j.w.Prompt)
	j.res.Decision, j.res.Target = d, d.Target
	// The group reserves the sequence's state before anything runs; a job
	// that cannot be placed is refused, not queued.
	need := c.s.Model.StateBytes(j.w.Prompt + j.w.Output)
	if c.memFree >= 0 {
		if need > c.memFree {
			c.refuse(j, fmt.Sprintf("decode group: a sequence of %d tokens needs %d bytes of state, %d are free", j.w.Prompt+j.w.Output, need, c.memFree))
			return
		}
		c.memFree -= need
		j.reserved = need
	}
	var delay float64
	if cp := c.s.Control; cp != nil {
		delay = cp.RemoteMS
		if d.Target == router.TargetLocal {
			delay = cp.LocalMS
		}
	}
	c.loop.After(seconds(delay/1e3), func() { c.dispatch(j) })
}

// dispatch hands a routed job to its workers, once the control plane has
// carried it there.
func (c *cluster) dispatch(j *simJob) {
	switch {
	case j.res.Target == router.TargetLocal:
		if j.total == 0 {
			c.toGroup(j)
			return
		}
		c.gq = append(c.gq, j)
		c.kickGroup()
	case c.groupBusy:
		c.admitting = append(c.admitting, j)
	default:
		c.admitted(j)
	}
}

// admitted: the decode group holds a remote job's sequence; the prefill
// worker takes it.
func (c *cluster) admitted(j *simJob) {
	now := c.loop.Now()
	switch {
	case j.total == 0:
		// Nothing to prefill: the worker hands over every layer's empty
		// state at once (scheduler.finishEmpty).
		var bytes int64
		end := now
		for L, l := range c.s.Model.Layers {
			_, e := c.link.SendLayer(L, now, l.State(0))
			bytes, end = bytes+l.State(0), max(end, e)
		}
		j.res.Bytes = bytes
		j.passEnd = now
		c.loop.At(end+c.link.RTT, func() { c.delivered(j) })
	default:
		c.waiting = append(c.waiting, j)
		c.kickPrefill()
	}
}

// stepDone ends the decode group's step in flight: remote jobs waiting
// for their admission are admitted, and the group takes its next step.
func (c *cluster) stepDone() {
	c.groupBusy = false
	adm := c.admitting
	c.admitting = nil
	for _, j := range adm {
		c.admitted(j)
	}
	c.kickGroup()
}

// kickPrefill starts the next pass if the box is idle, with the pass
// scheduler's own rule (scheduler.Next): jobs in progress first, then
// waiting jobs in arrival order; committing jobs' sink queues count as
// draining memory; the planner decides which tokens of which jobs the pass
// takes.
func (c *cluster) kickPrefill() {
	if c.s.Prefill == nil || c.running {
		return
	}
	for {
		js := append(slices.Clone(c.progress), c.waiting...)
		if len(js) == 0 {
			return
		}
		pj := make([]planner.Job, len(js))
		for i, j := range js {
			pj[i] = planner.Job{ID: j.w.ID, Total: j.total, Done: j.done}
		}
		var draining int64
		for _, j := range c.committing {
			draining += int64(c.opt.SinkQueue+1) * c.costs.LayerState(j.total)
		}
		st := scheduler.Next(planner.Input{Costs: c.costs, Budget: c.budget, Depth: -1, MaxDepth: c.s.Prefill.MaxDepth,
			MaxTile: c.s.Prefill.MaxTile, Jobs: pj, Draining: draining})
		for _, d := range st.Drops {
			c.dropFromPrefill(js[d.Job], fmt.Sprintf("prefill box: %v", d.Err))
		}
		if st.Run {
			c.runPass(st.Plan, js)
			return
		}
		if st.Wait {
			return // a commit frees memory and kicks again
		}
	}
}

func (c *cluster) dropFromPrefill(j *simJob, why string) {
	c.waiting = slices.DeleteFunc(c.waiting, func(x *simJob) bool { return x == j })
	c.progress = slices.DeleteFunc(c.progress, func(x *simJob) bool { return x == j })
	c.refuse(j, why)
}

func (c *cluster) runPass(plan planner.Plan, js []*simJob) {
	now := c.loop.Now()
	n := len(c.s.Model.Layers)
	compute := make([]time.Duration, n)
	for L := range compute {
		compute[L] = layerCompute(c.s, L, plan.Pieces)
	}
	emit := make([][]int64, len(plan.Pieces))
	for i, pc := range plan.Pieces {
		j := js[pc.Job]
		if !j.started {
			j.started, j.start = true, now
			j.res.Queue = now - j.res.Arrival
			c.waiting = slices.DeleteFunc(c.waiting, func(x *simJob) bool { return x == j })
			c.progress = append(c.progress, j)
		}
		c.inPass[j] = pc.Len()
		if pc.Final {
			emit[i] = make([]int64, n)
			for L, l := range c.s.Model.Layers {
				emit[i][L] = l.State(j.total)
			}
		}
	}
	t := TimePass(PassInput{Start: now, Read: c.reads, Compute: compute, Depth: plan.Depth, SinkQueue: c.opt.SinkQueue, Emit: emit}, &c.link)
	c.running, c.runEnd = true, t.End
	pr := PassResult{Index: len(c.passes) + 1, Start: now, End: t.End, Jobs: len(plan.Pieces), Tokens: plan.Tokens,
		Depth: plan.Depth, Tile: plan.Tile, Read: t.Read, Compute: t.Compute, ReadWait: t.ReadWait, SinkWait: t.SinkWait}
	for _, b := range t.Bytes {
		pr.Bytes += b
	}
	c.loop.At(t.End, func() { c.endPass(plan, js, pr) })
	for i, pc := range plan.Pieces {
		if pc.Final {
			j := js[pc.Job]
			j.res.Bytes += t.Bytes[i]
			c.loop.At(t.Delivered[i], func() { c.delivered(j) })
		}
	}
}

func (c *cluster) endPass(plan planner.Plan, js []*simJob, pr PassResult) {
	now := c.loop.Now()
	c.running = false
	c.passes = append(c.passes, pr)
	// As the prefill worker does: the floor is the pass's read time, and
	// the compute terms are fitted to the pass's work and compute time.
	c.est.ObserveFloor(pr.Read)
	var work costmodel.FLOPs
	for _, pc := range plan.Pieces {
		work = work.Add(c.s.Model.Cost.Work(pc.Lo, pc.Hi))
	}
	// The pass times its attention apart, as the executor does.
	attn := costmodel.FLOPs{Attn: work.Attn}.Time(c.s.Prefill.Compute)
	c.est.ObservePrefill(costmodel.Sample{Work: work, Calls: len(c.s.Model.Layers), Took: pr.Compute, Attention: attn})
	for _, pc := range plan.Pieces {
		j := js[pc.Job]
		delete(c.inPass, j)
		j.done += pc.Len()
		j.res.Passes++
		if pc.Final {
			j.passEnd = now
			j.res.Prefill = now - j.start
			c.progress = slices.DeleteFunc(c.progress, func(x *simJob) bool { return x == j })
			c.committing = append(c.committing, j)
		}
	}
	c.kickPrefill()
}

// delivered: the job's state is committed on the group.
func (c *cluster) delivered(j *simJob) {
	c.committing = slices.DeleteFunc(c.committing, func(x *simJob) bool { return x == j })
	j.res.TransferTail = c.loop.Now() - j.passEnd
	c.toGroup(j)
	c.kickPrefill()
}

// toGroup: the job's state is complete on the group; its first token is the
// next decode step's.
func (c *cluster) toGroup(j *simJob) {
	j.ready = c.loop.Now()
	c.readyQ = append(c.readyQ, j)
	c.kickGroup()
}

func (c *cluster) kickGroup() {
	if c.groupBusy {
		return
	}
	decode := len(c.readyQ)+len(c.decoding) > 0
	switch {
	case decode && (len(c.gq) == 0 || c.lastPrefill):
		c.decodeStep()
	case len(c.gq) > 0:
		c.prefillChunk()
	}
}

func (c *cluster) decodeStep() {
	g := c.s.Decode
	batch := append(slices.Clone(c.readyQ), c.decoding...)
	c.readyQ, c.decoding = nil, nil
	maxBatch := g.MaxBatch
	if maxBatch <= 0 {
		maxBatch = 64
	}
	step := seconds(g.DecodeStepMS / 1e3)
	d := time.Duration((len(batch)+maxBatch-1)/maxBatch) * step
	c.groupBusy, c.lastPrefill = true, false
	c.loop.After(d, func() {
		now := c.loop.Now()
		c.est.ObserveDecodeStep(step)
		for _, j := range batch {
			j.emitted++
			if j.emitted == 1 {
				j.res.FirstToken = now
				j.res.TTFT = now - j.res.Arrival
				j.res.FirstStep = now - j.ready
			}
			if j.emitted >= j.w.Output {
				j.res.Done = now
				if j.reserved > 0 {
					c.memFree += j.reserved
					j.reserved = 0
				}
				continue
			}
			c.decoding = append(c.decoding, j)
		}
		c.stepDone()
	})
}

// prefillChunk runs one prefill step of the group: prompt chunks from the
// queue in order, up to the chunk's rows, so that short prompts queued
// together share a step. As in the group's pipeline, a prompt with tokens
// left goes to the back of the queue, behind the prompts that arrived
// meanwhile: queued prompts are served in turn. (The pipeline also
// overlaps the steps of different prompts on different ranks; this model
// runs one step at a time.)
func (c *cluster) prefillChunk() {
	now := c.loop.Now()
	budget := chunkOf(c.s.Decode)
	var step []groupPiece
	for _, j := range c.gq {
		if budget <= 0 {
			break
		}
		if !j.started {
			j.started, j.start = true, now
			j.res.Queue = now - j.res.Arrival
		}
		n := min(j.total-j.done, budget)
		step = append(step, groupPiece{j: j, lo: j.done, hi: j.done + n})
		budget -= n
	}
	d := c.cost.Step(step)
	for _, p := range step {
		p.j.attention += c.cost.Attention(p.lo, p.hi)
	}
	c.groupBusy, c.lastPrefill = true, true
	c.loop.After(d, func() {
		now := c.loop.Now()
		for _, p := range step {
			j := p.j
			j.done = p.hi
			c.gq = slices.DeleteFunc(c.gq, func(x *simJob) bool { return x == j })
			if j.done < j.total {
				c.gq = append(c.gq, j)
				continue
			}
			j.res.Prefill = now - j.start
			// As the decode group does: the prompt's work against the time
			// from its first chunk to its last.
			chunks := (j.total + chunkOf(c.s.Decode) - 1) / chunkOf(c.s.Decode)
			c.est.ObserveLocal(costmodel.Sample{Work: c.s.Model.Cost.Work(0, j.total), Calls: chunks * len(c.s.Model.Layers), Took: j.res.Prefill,
				Attention: j.attention})
			j.ready = now
			c.readyQ = append(c.readyQ, j)
		}
		c.stepDone()
	})
}
