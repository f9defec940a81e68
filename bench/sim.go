package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/bench/sim"
	"github.com/tandem-inference/tandem/bench/workload"
	"github.com/tandem-inference/tandem/coordinator/router"
)

func init() {
	register(command{name: "sim", short: "simulate a cluster (K3 on hardware profiles): TTFT by prompt length, break-even, policies on a workload", run: stages(parseSimFlags, runSim)})
}

// defaultLengths are the prompt lengths of the projection: 1k to 1M tokens.
const defaultLengths = "1000,2000,5000,10000,20000,50000,100000,200000,300000,500000,1000000"

// simConfig is bench sim's configuration, from its flags.
type simConfig struct {
	model, prefill, decode, links string
	workload, trace               string
	rate                          float64
	seed                          uint64
	policies, lengths             string
	threshold                     int
	agentHistory, agentNew        int
	out                           string
	asJSON                        bool
	args                          []string // the command line, for REPORT.md
}

// simOutput is the JSON line of bench sim.
type simOutput struct {
	Model    string `json:"model"`
	Workload struct {
		Name           string  `json:"name"`
		Jobs           int     `json:"jobs"`
		Sessions       int     `json:"sessions"`
		MedianPrompt   int     `json:"median_prompt_tokens"`
		MaxPrompt      int     `json:"max_prompt_tokens"`
		ArrivalsPerMin float64 `json:"arrivals_per_min"`
	} `json:"workload"`
	// Setup is the setup whose figures are in Policies (the first prefill
	// profile with the first link); PoliciesBySetup has every setup's.
	Setup           string                            `json:"setup"`
	Policies        map[string]sim.Summary            `json:"policies"`
	PoliciesBySetup map[string]map[string]sim.Summary `json:"policies_by_setup"`
	// TTFT in seconds by setup and prompt length, idle cluster: the decode
	// group alone (local), each GPU box with the group (remote), and the
	// best of the two (":auto"). The key is k3_ttft_s for K3, ttft_s
	// otherwise.
	TTFT      map[string]map[string]float64 `json:"k3_ttft_s,omitempty"`
	TTFTOther map[string]map[string]float64 `json:"ttft_s,omitempty"`
	// BreakEven is the shortest prompt for which remote beats local
	// (simulated), RouterBreakEven the router's own prediction.
	BreakEven       map[string]int     `json:"breakeven_tokens"`
	RouterBreakEven map[string]int     `json:"router_breakeven_tokens"`
	PassFloorS      map[string]float64 `json:"pass_floor_s"`
	// Breakdown is where an idle job's time goes, by setup and length.
	Breakdown map[string]map[string]simBreakdown `json:"time_breakdown"`
	// Agent is a session's next turn by setup, without and with the prefix
	// caches (see agentTurn).
	Agent map[string]simAgent `json:"agent_turn"`
	// Speculative is one stream's decode on the decode group with drafts,
	// by per-token acceptance rate (see speculate).
	Speculative []simSpec `json:"speculative_decode"`
	// Tensor is decode by pipeline x tensor layout of the group's Macs,
	// one stream and 16 (see tensorDecode).
	Tensor []simTensor `json:"tensor_decode"`
	Out    string      `json:"out,omitempty"`
}

// simBreakdown splits an idle job's TTFT (seconds).
type simBreakdown struct {
	Target       string  `json:"target"`
	ReadWait     float64 `json:"read_wait_s"`
	Compute      float64 `json:"compute_s"`
	SinkWait     float64 `json:"sink_wait_s"`
	LocalPrefill float64 `json:"local_prefill_s"`
	TransferTail float64 `json:"transfer_tail_s"`
	FirstStep    float64 `json:"first_step_s"`
	TTFT         float64 `json:"ttft_s"`
	Passes       int     `json:"passes"`
}

// parseSimFlags parses bench sim's command line. After --help it returns
// pflag.ErrHelp.
func parseSimFlags(args []string) (simConfig, error) {
	f := simConfig{args: args}
	fs := pflag.NewFlagSet("sim", pflag.ContinueOnError)
	fs.StringVar(&f.model, "model", "k3", "model: a preset (k3, tiny, small, medium), a config.json or a checkpoint directory")
	fs.StringVar(&f.prefill, "prefill", "rtx5090,h200", "prefill boxes: hardware profiles (configs/hardware) or .yaml paths, comma-separated")
	fs.StringVar(&f.decode, "decode", "m3ultra-x4", "the decode group's hardware profile")
	fs.StringVar(&f.links, "link", "10gbe", "links between box and group, comma-separated (each box is simulated with each)")
	fs.StringVar(&f.workload, "workload", "mix", "generated workload: mix (short and long prompts) or agent (growing sessions), at K3 scale for k3 and at the scale of a small model on one machine otherwise (bench/workload K3Mix, LocalMix...)")
	fs.StringVar(&f.trace, "trace", "", "replay this trace file (JSON Lines, see bench/workload) instead of a generated workload")
	fs.Float64Var(&f.rate, "rate", 0, "generated workload: jobs (mix) or sessions (agent) per minute (default 1 at K3 scale, 60 (mix) or 20 (agent) otherwise)")
	fs.Uint64Var(&f.seed, "seed", 1, "generated workload: random seed")
	fs.StringVar(&f.policies, "policies", "local,remote,auto,threshold", "routing policies to compare on the workload")
	fs.IntVar(&f.threshold, "threshold", 1000, "prompt length above which the threshold policy goes remote")
	fs.StringVar(&f.lengths, "lengths", defaultLengths, "prompt lengths of the TTFT projection")
	fs.IntVar(&f.agentHistory, "agent-history", 300000, "agent turn: the session's history in tokens (cached on both sides with the prefix caches)")
	fs.IntVar(&f.agentNew, "agent-new", 1000, "agent turn: the new tokens of the turn")
	fs.StringVar(&f.out, "out", "", "write charts (PNG) and REPORT.md into this directory")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object as the last line")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: bench sim [flags]

Simulates a tandem cluster with the code the system runs (the coordinator's
router, the pass planner, the pass scheduler's batching rule) on hardware
profiles, layer by layer: weight reads against compute with the planner's
prefetch depth, each layer's state streamed over the link, the decode group's
own prefill and decode steps. It prints the TTFT of an idle cluster against
prompt length for the decode group alone and each prefill box with it, the
prompt length where remote prefill starts to win, where the time goes, and
the policies compared on a workload.

`)
		fs.PrintDefaults()
	}
	return f, parseFlags(fs, args)
}

// validate checks the flags that need no file or profile: the prompt
// lengths and the policies.
func (f simConfig) validate() error {
	if _, err := parseLengths(f.lengths); err != nil {
		return err
	}
	_, err := f.policyList()
	return err
}

// policyList is --policies parsed.
func (f simConfig) policyList() ([]router.Policy, error) {
	var policies []router.Policy
	for _, p := range splitList(f.policies) {
		switch pol := router.Policy(p); pol {
		case router.Local, router.Remote, router.Auto, router.Threshold:
			policies = append(policies, pol)
		default:
			return nil, fmt.Errorf("--policies: unknown policy %q (local, remote, auto, threshold)", p)
		}
	}
	return policies, nil
}

// simRun is one bench sim run: its inputs, loaded, and what it gathers.
type simRun struct {
	cfg      simConfig
	lengths  []int
	policies []router.Policy
	m        *sim.Model
	macs     sim.Setup   // the decode group alone
	setups   []sim.Setup // each prefill box with each link
	jobs     []workload.Job
	out      simOutput
	order    []string             // the projection's setups, in order
	curves   map[string][]float64 // TTFT by setup, along lengths
	results  map[string]map[router.Policy]*sim.Result
}

func runSim(ctx context.Context, f simConfig) error {
	r, err := loadSim(f)
	if err != nil {
		return err
	}
	if err := r.project(ctx); err != nil {
		return err
	}
	r.agentTurns()
	r.speculate()
	if err := r.tensorDecode(); err != nil {
		return err
	}
	if err := r.comparePolicies(ctx); err != nil {
		return err
	}
	return r.write()
}

// loadSim loads the model, the profiles and the workload of f.
func loadSim(f simConfig) (*simRun, error) {
	r := &simRun{cfg: f}
	var err error
	if r.lengths, err = parseLengths(f.lengths); err != nil {
		return nil, err
	}
	if r.policies, err = f.policyList(); err != nil {
		return nil, err
	}
	if r.m, err = sim.LoadModel(f.model); err != nil {
		return nil, err
	}
	decode, err := sim.LoadProfile(f.decode)
	if err != nil {
		return nil, err
	}
	if r.macs, err = sim.NewSetup(r.m, nil, decode, nil); err != nil {
		return nil, err
	}
	for _, pn := range splitList(f.prefill) {
		pp, err := sim.LoadProfile(pn)
		if err != nil {
			return nil, err
		}
		for _, ln := range splitList(f.links) {
			lp, err := sim.LoadProfile(ln)
			if err != nil {
				return nil, err
			}
			s, err := sim.NewSetup(r.m, pp, decode, lp)
			if err != nil {
				return nil, err
			}
			r.setups = append(r.setups, s)
		}
	}
	jobs, wname, err := simWorkload(f, r.m.Name)
	if err != nil {
		return nil, err
	}
	r.jobs = jobs
	r.out = simOutput{Model: r.m.Name, PoliciesBySetup: map[string]map[string]sim.Summary{}, BreakEven: map[string]int{},
		RouterBreakEven: map[string]int{}, PassFloorS: map[string]float64{}, Breakdown: map[string]map[string]simBreakdown{}}
	ws := workload.Summarize(jobs)
	r.out.Workload.Name, r.out.Workload.Jobs, r.out.Workload.Sessions = wname, ws.Jobs, ws.Sessions
	r.out.Workload.MedianPrompt, r.out.Workload.MaxPrompt, r.out.Workload.ArrivalsPerMin = ws.MedianPrompt, ws.MaxPrompt, ws.ArrivalsPerMin
	r.curves = map[string][]float64{}
	return r, nil
}

// project fills the projection: idle TTFT by prompt length, where the time
// goes and the break-even of each setup.
func (r *simRun) project(ctx context.Context) error {
	ttft := map[string]map[string]float64{}
	addPoint := func(key string, n int, s float64) {
		if ttft[key] == nil {
			ttft[key] = map[string]float64{}
			r.order = append(r.order, key)
		}
		ttft[key][strconv.Itoa(n)] = round3(s)
		r.curves[key] = append(r.curves[key], s)
	}
	out := &r.out
	out.Breakdown[r.macs.Name] = map[string]simBreakdown{}
	for _, n := range r.lengths {
		j, err := sim.Idle(ctx, r.macs, router.Local, n)
		if err != nil {
			return err
		}
		addPoint(r.macs.Name, n, j.TTFT.Seconds())
		out.Breakdown[r.macs.Name][strconv.Itoa(n)] = breakdown(j)
	}
	for _, s := range r.setups {
		out.Breakdown[s.Name] = map[string]simBreakdown{}
		for _, n := range r.lengths {
			j, b, err := idleRemote(ctx, s, n)
			if err != nil {
				return err
			}
			addPoint(s.Name, n, j.TTFT.Seconds())
			out.Breakdown[s.Name][strconv.Itoa(n)] = b
			a, err := sim.Idle(ctx, s, router.Auto, n)
			if err != nil {
				return err
			}
			addPoint(s.Name+":auto", n, a.TTFT.Seconds())
		}
		be, err := sim.BreakEven(ctx, s, 1<<20)
		if err != nil {
			return err
		}
		out.BreakEven[s.Name] = be
		out.RouterBreakEven[s.Name] = router.BreakEven(r.m.Cost, sim.SeedRates(s, 8192), 1<<20)
		out.PassFloorS[s.Name] = round3(sim.PassFloor(s).Seconds())
	}
	if r.m.Name == "k3" {
		out.TTFT = ttft
	} else {
		out.TTFTOther = ttft
	}
	return nil
}

// breakdown is where idle job j's time went, less its passes' split.
func breakdown(j sim.JobResult) simBreakdown {
	b := simBreakdown{Target: string(j.Target), TransferTail: j.TransferTail.Seconds(), FirstStep: j.FirstStep.Seconds(), TTFT: j.TTFT.Seconds(), Passes: j.Passes}
	if j.Target == router.TargetLocal {
		b.LocalPrefill = j.Prefill.Seconds()
	}
	return b
}

// idleRemote runs an n-token prompt remotely on an idle setup s and splits
// its time.
func idleRemote(ctx context.Context, s sim.Setup, n int) (sim.JobResult, simBreakdown, error) {
	r, err := sim.Run(ctx, s, []workload.Job{{ID: "idle", Prompt: n, Output: 1}}, sim.Options{Policy: router.Remote})
	if err != nil {
		return sim.JobResult{}, simBreakdown{}, err
	}
	j := r.Jobs[0]
	if j.Refused != "" {
		return j, simBreakdown{}, fmt.Errorf("%s: a %d-token prompt was refused: %s", s.Name, n, j.Refused)
	}
	b := breakdown(j)
	for _, p := range r.Passes { // a prompt split into super-chunks spans several passes
		b.ReadWait += p.ReadWait.Seconds()
		b.Compute += p.Compute.Seconds()
		b.SinkWait += p.SinkWait.Seconds()
	}
	return j, b, nil
}

// agentTurns fills the agent turn of each setup.
func (r *simRun) agentTurns() {
	r.out.Agent = map[string]simAgent{r.macs.Name: agentTurn(r.macs, r.cfg.agentHistory, r.cfg.agentNew)}
	for _, s := range r.setups {
		r.out.Agent[s.Name] = agentTurn(s, r.cfg.agentHistory, r.cfg.agentNew)
	}
}

// agentOrder is the setups of the agent turn table, in order.
func (r *simRun) agentOrder() []string {
	order := []string{r.macs.Name}
	for _, s := range r.setups {
		order = append(order, s.Name)
	}
	return order
}

// comparePolicies runs the workload under each policy, on every setup.
func (r *simRun) comparePolicies(ctx context.Context) error {
	r.results = map[string]map[router.Policy]*sim.Result{}
	for _, s := range r.setups {
		r.out.PoliciesBySetup[s.Name] = map[string]sim.Summary{}
		r.results[s.Name] = map[router.Policy]*sim.Result{}
		for _, p := range r.policies {
			res, err := sim.Run(ctx, s, r.jobs, sim.Options{Policy: p, Threshold: r.cfg.threshold})
			if err != nil {
				return err
			}
			r.results[s.Name][p] = res
			r.out.PoliciesBySetup[s.Name][string(p)] = sim.Summarize(res)
		}
	}
	if len(r.setups) > 0 {
		r.out.Setup = r.setups[0].Name
		r.out.Policies = r.out.PoliciesBySetup[r.out.Setup]
	}
	return nil
}

// write prints the tables, writes the report with --out and prints the JSON
// line with --json.
func (r *simRun) write() error {
	f := r.cfg
	tables := simTables(&r.out, r.order, r.lengths, r.setups, r.policies)
	tables = append(tables, agentTable(r.m.Name, f.agentHistory, f.agentNew, r.agentOrder(), r.out.Agent),
		specTable(r.m.Name, r.macs.Name, r.out.Speculative), tensorTable(r.m.Name, r.macs.Name, r.out.Tensor))
	for _, t := range tables {
		if err := t.Write(os.Stdout); err != nil {
			return err
		}
		fmt.Println()
	}
	if f.out != "" {
		if err := r.report(tables); err != nil {
			return err
		}
		r.out.Out = f.out
		fmt.Fprintf(os.Stderr, "sim: charts and REPORT.md in %s\n", f.out)
	}
	if f.asJSON {
		return report.JSONLine(os.Stdout, r.out)
	}
	return nil
}

// simWorkload builds the workload of the flags.
func simWorkload(f simConfig, modelName string) ([]workload.Job, string, error) {
	if f.trace != "" {
		jobs, err := workload.LoadTrace(f.trace)
		return jobs, f.trace, err
	}
	k3 := modelName == "k3"
	rate := f.rate
	if rate == 0 {
		rate = map[bool]map[string]float64{true: {"mix": 1, "agent": 1}, false: {"mix": 60, "agent": 20}}[k3][f.workload]
	}
	if !(rate > 0) {
		return nil, "", fmt.Errorf("--rate %v: want a positive number per minute", f.rate)
	}
	scale := "local scale"
	if k3 {
		scale = "K3 scale"
	}
	switch f.workload {
	case "mix":
		spec := workload.LocalMix(f.seed, rate)
		if k3 {
			spec = workload.K3Mix(f.seed, rate)
		}
		jobs, err := workload.Mix(spec)
		return jobs, fmt.Sprintf("mix at %s (%v jobs/min, seed %d)", scale, rate, f.seed), err
	case "agent":
		spec := workload.LocalAgent(f.seed, rate)
		if k3 {
			spec = workload.K3Agent(f.seed, rate)
		}
		jobs, err := workload.Agent(spec)
		return jobs, fmt.Sprintf("agent sessions at %s (%v sessions/min, seed %d)", scale, rate, f.seed), err
	}
	return nil, "", fmt.Errorf("--workload %q: want mix or agent (or --trace FILE)", f.workload)
}

func simTables(out *simOutput, order []string, lengths []int, setups []sim.Setup, policies []router.Policy) []*report.Table {
	ttft := out.TTFT
	if ttft == nil {
		ttft = out.TTFTOther
	}
	proj := &report.Table{Title: fmt.Sprintf("TTFT of one prompt on an idle cluster (%s)", out.Model), Header: append([]string{"prompt"}, order...)}
	for _, n := range lengths {
		row := []string{report.Tokens(n)}
		for _, k := range order {
			row = append(row, report.Duration(ttft[k][strconv.Itoa(n)]))
		}
		proj.Add(row...)
	}
	proj.Notes = []string{"Setups: the decode group alone prefills locally; box+group/link prefills remotely; :auto is the router's choice."}

	be := &report.Table{Title: "Where remote prefill starts to win", Header: []string{"setup", "pass floor", "break-even (sim)", "break-even (router)"}}
	for _, s := range setups {
		be.Add(s.Name, report.Duration(out.PassFloorS[s.Name]), fmt.Sprint(out.BreakEven[s.Name]), fmt.Sprint(out.RouterBreakEven[s.Name]))
	}

	where := &report.Table{Title: "Where the time goes (idle, seconds)", Header: []string{"setup", "prompt", "read wait", "compute", "sink wait", "local prefill", "tail", "first step", "TTFT", "passes"}}
	for _, k := range append([]string{}, order...) {
		b, ok := out.Breakdown[k]
		if !ok {
			continue
		}
		for _, n := range lengths {
			if n != 1000 && n != 10000 && n != 100000 && n != 300000 && n != 1000000 {
				continue
			}
			x, ok := b[strconv.Itoa(n)]
			if !ok {
				continue
			}
			where.Addf([]string{"", "", "%.2f", "%.2f", "%.2f", "%.2f", "%.3f", "%.3f", "%.2f"}, k, report.Tokens(n), x.ReadWait, x.Compute, x.SinkWait, x.LocalPrefill, x.TransferTail, x.FirstStep, x.TTFT, x.Passes)
		}
	}
	tables := []*report.Table{proj, be, where}
	for _, s := range setups {
		pt := &report.Table{Title: fmt.Sprintf("Policies on %s, %s", out.Workload.Name, s.Name),
			Header: []string{"policy", "jobs", "remote", "local", "refused", "TTFT p50", "p95", "p99", "jobs/min", "jobs/pass", "moved", "tail p50", "tail max", "decode tok/s"}}
		for _, p := range policies {
			x := out.PoliciesBySetup[s.Name][string(p)]
			pt.Add(string(p), fmt.Sprint(x.Jobs), fmt.Sprint(x.Remote), fmt.Sprint(x.Local), fmt.Sprint(x.Refused),
				report.Duration(x.TTFTP50), report.Duration(x.TTFTP95), report.Duration(x.TTFTP99),
				fmt.Sprintf("%.2f", x.JobsPerMin), fmt.Sprintf("%.2f", x.JobsPerPass), report.Bytes(x.BytesMoved),
				report.Duration(x.ExposedTailP50), report.Duration(x.ExposedTailMax), fmt.Sprintf("%.1f", x.DecodeTokPerS))
		}
		pt.Notes = []string{"jobs/pass: jobs sharing a weight pass; moved: state sent over the link; tail: state still in flight after a remote job's last pass."}
		tables = append(tables, pt)
	}
	return tables
}

// report writes the charts and REPORT.md into --out.
func (r *simRun) report(tables []*report.Table) error {
	if err := r.ttftChart(); err != nil {
		return err
	}
	if err := r.breakdownChart(); err != nil {
		return err
	}
	charts, err := r.policyCharts()
	if err != nil {
		return err
	}
	return r.reportDoc(tables, charts)
}

// ttftChart draws the projection: TTFT against prompt length.
func (r *simRun) ttftChart() error {
	xs := make([]float64, len(r.lengths))
	for i, n := range r.lengths {
		xs[i] = float64(n)
	}
	lc := report.LineChart{Title: fmt.Sprintf("%s: TTFT of one prompt, idle cluster", r.out.Model), XLabel: "prompt tokens", YLabel: "TTFT (s)", LogX: true, LogY: true}
	for _, k := range r.order {
		lc.Series = append(lc.Series, report.Series{Name: k, X: xs, Y: r.curves[k]})
	}
	return lc.SavePNG(filepath.Join(r.cfg.out, "ttft_by_length.png"))
}

// breakdownChart draws where the time goes at a few prompt lengths; none
// when the lengths include none of them.
func (r *simRun) breakdownChart() error {
	sb := report.StackedBars{Title: "Where the time goes (idle)", YLabel: "seconds"}
	parts := []string{"read wait", "compute", "sink wait", "local prefill", "transfer tail", "first step"}
	vals := make([][]float64, len(parts))
	for _, k := range r.order {
		b, ok := r.out.Breakdown[k]
		if !ok {
			continue
		}
		for _, n := range []int{10000, 100000, 300000} {
			x, ok := b[strconv.Itoa(n)]
			if !ok {
				continue
			}
			sb.Categories = append(sb.Categories, shortSetup(k)+" "+report.Tokens(n))
			for i, v := range []float64{x.ReadWait, x.Compute, x.SinkWait, x.LocalPrefill, x.TransferTail, x.FirstStep} {
				vals[i] = append(vals[i], v)
			}
		}
	}
	for i, p := range parts {
		sb.Parts = append(sb.Parts, report.Part{Name: p, Values: vals[i]})
	}
	if len(sb.Categories) == 0 {
		return nil
	}
	return sb.SavePNG(filepath.Join(r.cfg.out, "time_breakdown.png"))
}

// policyCharts draws each setup's TTFT by policy and returns the charts'
// file names by setup ("" where no job completed).
func (r *simRun) policyCharts() ([]string, error) {
	charts := make([]string, len(r.setups))
	for i, s := range r.setups {
		sc := report.LineChart{Title: fmt.Sprintf("TTFT by policy: %s on %s", r.out.Workload.Name, s.Name), XLabel: "prompt tokens", YLabel: "TTFT (s)", LogX: true, LogY: true, Scatter: true}
		completed := 0
		for _, p := range r.policies {
			completed += r.out.PoliciesBySetup[s.Name][string(p)].Completed
		}
		if completed == 0 {
			say("sim: %s: no job completed under any policy, no TTFT chart", s.Name)
			continue
		}
		for _, p := range r.policies {
			var x, y []float64
			for _, j := range r.results[s.Name][p].Jobs {
				if j.Refused == "" {
					x, y = append(x, float64(j.Prompt)), append(y, j.TTFT.Seconds())
				}
			}
			sc.Series = append(sc.Series, report.Series{Name: string(p), X: x, Y: y})
		}
		name := fmt.Sprintf("ttft_by_policy_%d.png", i+1)
		if err := sc.SavePNG(filepath.Join(r.cfg.out, name)); err != nil {
			return nil, err
		}
		charts[i] = name
	}
	return charts, nil
}

// reportDoc writes REPORT.md: the tables, with the charts.
func (r *simRun) reportDoc(tables []*report.Table, charts []string) error {
	var d report.Doc
	d.Heading(1, "bench sim: "+r.out.Model)
	d.Para("Simulated with the router, pass planner and pass scheduler rule the system runs, on the hardware profiles of configs/hardware. Reproduce with:")
	d.Code("sh", "go run ./bench sim "+strings.Join(r.cfg.args, " "))
	d.Heading(2, "TTFT against prompt length")
	d.Table(tables[0])
	d.Image("TTFT by prompt length", "ttft_by_length.png")
	d.Heading(2, "Break-even")
	d.Table(tables[1])
	d.Heading(2, "Where the time goes")
	d.Para("read wait: compute waiting for weights (the part of the pass floor compute does not hide); sink wait: compute waiting for the link; tail: state still in flight after the pass; first step: the decode group's first token.")
	d.Table(tables[2])
	d.Image("Time breakdown", "time_breakdown.png")
	d.Heading(2, "Policies on the workload")
	for i := 3; i < len(tables); i++ {
		d.Table(tables[i])
		if k := i - 3; k < len(charts) && charts[k] != "" {
			d.Image("TTFT by policy", charts[k])
		}
	}
	return d.WriteFile(filepath.Join(r.cfg.out, "REPORT.md"))
}

// shortSetup is a setup's name without the decode group and link, for bar
// labels.
func shortSetup(name string) string {
	if i := strings.IndexByte(name, '+'); i > 0 {
		return name[:i]
	}
	return name
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func parseLengths(s string) ([]int, error) {
	var out []int
	for _, x := range splitList(s) {
		n, err := strconv.Atoi(x)
		if err != nil || n < 1 || n > 1<<24 {
			return nil, fmt.Errorf("--lengths: %q is not a prompt length (1..%d tokens)", x, 1<<24)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("--lengths: no prompt length")
	}
	return out, nil
}

func round3(v float64) float64 {
	return float64(int64(v*1000+0.5)) / 1000
}
