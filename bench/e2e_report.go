package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/bench/sim"
	"github.com/tandem-inference/tandem/coordinator/router"
)

// e2eTables are the tables of bench e2e: the measurement, the simulator
// against it, where a job's time goes, the router's predictions against
// the measurement (per job and part by part, where any) and the probes.
func e2eTables(out *e2eOutput, runs []e2eRun) []*report.Table {
	tables := []*report.Table{measuredTable(out, runs), simulatorTable(out, runs), breakdownTable(out, runs), routerTable(out, runs)}
	if pr := partsTable(out, runs); len(pr.Rows) > 0 {
		tables = append(tables, pr)
	}
	if len(out.Probes) > 0 {
		tables = append(tables, probesTable(out), probeJobsTable(out))
	}
	return tables
}

// measuredTable is each policy's measured figures.
func measuredTable(out *e2eOutput, runs []e2eRun) *report.Table {
	pt := &report.Table{Title: fmt.Sprintf("Measured: %s on %s, %d decode ranks", out.Workload.Name, out.Model, out.Ranks),
		Header: []string{"policy", "jobs", "remote", "local", "failed", "TTFT p50", "p95", "p99", "jobs/min", "jobs/pass", "moved", "tail p50", "tail max", "decode tok/s"}}
	for _, r := range runs {
		x := out.Policies[string(r.policy)]
		pt.Add(string(r.policy), fmt.Sprint(x.Jobs), fmt.Sprint(x.Remote), fmt.Sprint(x.Local), fmt.Sprint(x.Refused),
			report.Duration(x.TTFTP50), report.Duration(x.TTFTP95), report.Duration(x.TTFTP99),
			fmt.Sprintf("%.2f", x.JobsPerMin), fmt.Sprintf("%.2f", x.JobsPerPass), report.Bytes(x.BytesMoved),
			report.Duration(x.ExposedTailP50), report.Duration(x.ExposedTailMax), fmt.Sprintf("%.1f", x.DecodeTokPerS))
	}
	pt.Notes = []string{"TTFT: submission sent to first token received by the client. jobs/pass: jobs sharing a weight pass; moved: state sent over kvtransfer; tail: state still in flight after a remote job's pass."}
	if out.LinkRate > 0 {
		pt.Notes = append(pt.Notes, fmt.Sprintf("The link to each decode rank is limited to %s/s.", report.Bytes(out.LinkRate)))
	}
	return pt
}

// simulatorTable sets the simulator's prediction of each policy against
// its measurement, and adds the simulated threshold rule.
func simulatorTable(out *e2eOutput, runs []e2eRun) *report.Table {
	ct := &report.Table{Title: fmt.Sprintf("Simulator (profile %s) against the measurement, same jobs", out.Profile),
		Header: []string{"policy", "TTFT p50 measured", "predicted", "predicted/measured", fmt.Sprintf("within %.0f%%", 100*out.Tolerance),
			"profile alone", "p95 measured", "predicted", "remote measured", "predicted", "rounds p50", "other load (probe / replay)"}}
	pct := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f%%", 100**v)
	}
	for _, r := range runs {
		x, p := out.Policies[string(r.policy)], out.Predicted[string(r.policy)]
		var rounds []string
		for _, v := range x.RoundP50 {
			rounds = append(rounds, report.Duration(v))
		}
		load := pct(x.OtherLoad)
		if x.ProbeLoad != nil {
			load = pct(x.ProbeLoad) + " / " + load
		}
		ct.Add(string(r.policy), report.Duration(x.TTFTP50), report.Duration(x.PredictedP50), fmt.Sprintf("%.2f", x.Ratio), yesNo(x.Within),
			fmt.Sprintf("%s (%.2f)", report.Duration(x.ProfileP50), x.ProfileRatio),
			report.Duration(x.TTFTP95), report.Duration(p.TTFTP95), fmt.Sprint(x.Remote), fmt.Sprint(p.Remote), strings.Join(rounds, ", "), load)
	}
	if th, ok := out.Predicted[string(router.Threshold)]; ok {
		ct.Add("threshold", "-", report.Duration(th.TTFTP50), "-", "-", "-", "-", report.Duration(th.TTFTP95), "-", fmt.Sprint(th.Remote), "-", "-")
	}
	ct.Notes = []string{"predicted: each replay from the profile with the figures of the probe just before it (control-plane latency, the prefill worker's pass compute, the decode group's prefill and step); profile alone: without them (its ratio in brackets).",
		fmt.Sprintf("threshold (remote above %d tokens) is simulated only: the coordinator routes by local, remote or auto.", out.Threshold),
		"other load: the share of the machine's cores other processes used during the probes before the replays and during the replays; a prediction from a probe taken under another load than its replay's is off by as much."}
	return ct
}

// breakdownTable is where a job's time goes per policy, measured and
// predicted.
func breakdownTable(out *e2eOutput, runs []e2eRun) *report.Table {
	bt := &report.Table{Title: "Where a job's time goes, mean per completed job (measured / predicted)",
		Header: []string{"policy", "queue", "prefill", "transfer tail", "first step", "TTFT mean", "marked after the first token"}}
	pair := func(a, b float64) string { return report.Duration(a) + " / " + report.Duration(b) }
	for _, r := range runs {
		x, p := out.Policies[string(r.policy)], out.Predicted[string(r.policy)]
		late := "none"
		if n, worst := lateMarks(r.measured); n > 0 {
			late = fmt.Sprintf("%d of %d, by up to %s", n, x.Completed, report.Duration(worst.Seconds()))
		}
		bt.Add(string(r.policy), pair(x.QueueMean, p.QueueMean), pair(x.PrefillMean, p.PrefillMean),
			pair(tailMean(r.measured), tailMean(r.predicted)), pair(x.FirstStepMean, p.FirstStepMean), pair(x.TTFTMean, p.TTFTMean), late)
	}
	bt.Notes = []string{"Measured remote: queue is submission to the weight pass's start, first step the rest after the state's commit (decode step and control-plane hops). Measured local: queue is submission to the decode group's start, prefill includes its first step.",
		"The parts are the coordinator's marks as measured, the TTFT the client's. Workers report to the coordinator on their own connections, so a remote job's commit (or a local job's first token) can be marked after the client already has its first token: such a job's parts add up to more than its TTFT by as much (the last column; late_mark_s in jobs.jsonl), and its first step counts 0."}
	return bt
}

// routerTable sets the router's predicted TTFT of each job against the
// measured one.
func routerTable(out *e2eOutput, runs []e2eRun) *report.Table {
	rt := &report.Table{Title: "The router's predicted TTFT against the measured one, per job (measured / predicted)",
		Header: []string{"policy", "p10", "p50", "p90", "jobs: prompt tokens, path, predicted -> measured", "load average"}}
	for _, r := range runs {
		x := out.Policies[string(r.policy)]
		var js []string
		for _, j := range x.PredJobs {
			js = append(js, fmt.Sprintf("%d %s %s -> %s", j.Prompt, j.Target, report.Duration(j.PredictedS), report.Duration(j.MeasuredS)))
		}
		la := "-"
		if x.LoadAverage != nil {
			la = x.LoadAverage.String()
		}
		rt.Add(string(r.policy), fmt.Sprintf("%.2f", x.PredRatioP10), fmt.Sprintf("%.2f", x.PredRatioP50), fmt.Sprintf("%.2f", x.PredRatioP90), strings.Join(js, "; "), la)
	}
	rt.Notes = []string{"The prediction is the coordinator's own, made when it routed the job (the routed event), from the workers' fitted cost-model terms at that moment; measured is the client's TTFT, submission sent to first token received.",
		fmt.Sprintf("Load average: the machine's 1-minute load average during the policy's replays, mean (min-max), on %d cores; above the core count, other work shared them.", runtime.NumCPU())}
	return rt
}

// partsTable sets the router's predicted parts of the TTFT against the
// measured ones, summed over the jobs (no rows where no route had parts).
func partsTable(out *e2eOutput, runs []e2eRun) *report.Table {
	pr := &report.Table{Title: "The router's predicted parts against the measured ones (sums over the jobs above)",
		Header: []string{"policy", "part", "jobs", "predicted", "measured", "measured - predicted, median per job", "largest"}}
	for _, r := range runs {
		for _, x := range out.Policies[string(r.policy)].PartResiduals {
			pr.Add(string(r.policy), x.Part, fmt.Sprint(x.Jobs), report.Duration(x.PredictedS), report.Duration(x.MeasuredS),
				fmt.Sprintf("%+.3f s", x.ResidualP50), fmt.Sprintf("%+.3f s", x.ResidualMax))
		}
	}
	pr.Notes = []string{"Remote: queue is submission to the weight pass's start (predicted: the running pass's rest and the control plane's latency), pass the prefill worker's pass, transfer tail its end to the state committed on every rank, first step the rest of the TTFT. Local: queue is the TTFT less the group's prefill (the control plane), prefill the group's prefill and first step."}
	return pr
}

// probesTable is what each probe before a replay measured (out has at
// least one probe).
func probesTable(out *e2eOutput) *report.Table {
	t := &report.Table{Title: "Probes of the idle system before each replay",
		Header: []string{"before", "round", "control plane local", "remote", "prefill worker's passes", "decode group's prefill", "decode step"}}
	for _, pr := range out.Probes {
		t.Add(pr.Policy, fmt.Sprint(pr.Round), fmt.Sprintf("%.2f ms", pr.ControlPlane.LocalMS), fmt.Sprintf("%.2f ms", pr.ControlPlane.RemoteMS),
			fmt.Sprintf("x%.2f (%.3f ms/layer, %.0f%%)", pr.PrefillFactor, pr.PrefillFit.OverheadMS, 100*pr.PrefillFit.Residual),
			fmt.Sprintf("x%.2f (%.3f ms/layer/chunk, %.0f%%)", pr.GroupFactor, pr.GroupFit.OverheadMS, 100*pr.GroupFit.Residual),
			fmt.Sprintf("%.2f ms", pr.DecodeStepMS))
	}
	t.Notes = []string{fmt.Sprintf("Control plane: the probes' TTFT (each the median of %d) less their simulated work, the median over the prompt lengths. Passes and group prefill: compute time against the profile's (x1.20 is 20%% slower), with the fixed cost and the worst misfit of the fit.", out.Probes[0].Reps)}
	return t
}

// probeJobsTable is the first probe's jobs against the simulator's idle
// TTFT, with the profile alone and with the probe's figures.
func probeJobsTable(out *e2eOutput) *report.Table {
	pt := &report.Table{Title: fmt.Sprintf("Probe jobs before the first replay, median of %d (TTFT)", out.Probes[0].Reps),
		Header: []string{"path", "prompt", "measured", "profile alone", "with the probe", "pass compute"}}
	for _, x := range out.Probes[0].Points {
		pc := "-"
		if x.PassCompute > 0 {
			pc = report.Duration(x.PassCompute)
		}
		pt.Add(x.Path, fmt.Sprint(x.Prompt), report.Duration(x.Measured), report.Duration(x.Profile), report.Duration(x.Probed), pc)
	}
	return pt
}

// lateMarks counts the completed jobs whose last part the coordinator
// marked after the client's first token, and the latest such mark.
func lateMarks(r *sim.Result) (n int, worst time.Duration) {
	for _, j := range r.Jobs {
		if d := lateMark(j); j.Refused == "" && d > 0 {
			n++
			worst = max(worst, d)
		}
	}
	return n, worst
}

// tailMean is the mean transfer tail over every completed job.
func tailMean(r *sim.Result) float64 {
	var t float64
	n := 0
	for _, j := range r.Jobs {
		if j.Refused == "" {
			t += j.TransferTail.Seconds()
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return t / float64(n)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func e2eReport(dir string, out *e2eOutput, tables []*report.Table, runs []e2eRun, args []string) error {
	sc := report.LineChart{Title: fmt.Sprintf("TTFT against prompt length: %s, %s", out.Model, out.Workload.Name),
		XLabel: "prompt tokens", YLabel: "TTFT (s)", LogX: true, LogY: true, Scatter: true}
	for _, r := range runs {
		var x, y []float64
		for _, j := range r.measured.Jobs {
			if j.Refused == "" {
				x, y = append(x, float64(j.Prompt)), append(y, j.TTFT.Seconds())
			}
		}
		sc.Series = append(sc.Series, report.Series{Name: string(r.policy), X: x, Y: y})
	}
	if err := sc.SavePNG(filepath.Join(dir, "ttft_by_prompt.png")); err != nil {
		return err
	}
	var d report.Doc
	d.Heading(1, "bench e2e: "+out.Model)
	d.Para("The whole system on this machine (embedded NATS, coordinator, CPU prefill worker, %d decode ranks, %d compute thread(s) per service), the workload replayed %d time(s) per policy, the policies in turn. Reproduce with:", out.Ranks, out.Threads, out.Rounds)
	d.Code("sh", strings.TrimSpace("go run ./bench e2e "+strings.Join(args, " ")))
	if a := out.LoadAverage; a != nil {
		d.Para("It took %s; the machine's 1-minute load average over the run was %.1f on average, %.1f to %.1f (%d cores: above that, other work shared them).",
			report.Duration(out.TookS), a.Mean, a.Min, a.Max, runtime.NumCPU())
	}
	d.Heading(2, "Measured")
	d.Table(tables[0])
	d.Image("TTFT against prompt length", "ttft_by_prompt.png")
	d.Heading(2, "Against the simulator")
	for _, t := range tables[1:] {
		d.Table(t)
	}
	d.Heading(2, "Time breakdown per job")
	for _, r := range runs {
		name := fmt.Sprintf("time_breakdown_%s.png", r.policy)
		drawn, err := breakdownChart(r, filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if drawn {
			d.Image("Time breakdown, policy "+string(r.policy), name)
		}
	}
	if err := writeJobs(filepath.Join(dir, "jobs.jsonl"), runs); err != nil {
		return err
	}
	if err := writePasses(filepath.Join(dir, "passes.jsonl"), runs); err != nil {
		return err
	}
	d.Para("Every job, measured next to predicted: jobs.jsonl; every weight pass: passes.jsonl.")
	return d.WriteFile(filepath.Join(dir, "REPORT.md"))
}

// breakdownChart stacks each completed job's measured TTFT parts, in
// arrival order (none drawn when no job completed); a job whose parts run
// past its TTFT (lateMark) says so in its label.
func breakdownChart(r e2eRun, path string) (bool, error) {
	sb := report.StackedBars{Title: fmt.Sprintf("Where each job's TTFT goes, policy %s (measured)", r.policy), YLabel: "seconds"}
	names := []string{"queue", "prefill", "transfer tail", "first step"}
	vals := make([][]float64, len(names))
	for _, j := range r.measured.Jobs {
		if j.Refused != "" {
			continue
		}
		label := fmt.Sprintf("%s %s", report.Tokens(j.Prompt), j.Target)
		if d := lateMark(j); d > 0 {
			label += " (" + report.Duration(d.Seconds()) + " past TTFT)"
		}
		sb.Categories = append(sb.Categories, label)
		for i, v := range []time.Duration{j.Queue, j.Prefill, j.TransferTail, j.FirstStep} {
			vals[i] = append(vals[i], v.Seconds())
		}
	}
	if len(sb.Categories) == 0 {
		return false, nil
	}
	for i, n := range names {
		sb.Parts = append(sb.Parts, report.Part{Name: n, Values: vals[i]})
	}
	return true, sb.SavePNG(path)
}

// e2eJob is one job of a replay in jobs.jsonl: measured and predicted.
type e2eJob struct {
	Policy          string  `json:"policy"`
	Round           int     `json:"round"`
	ID              string  `json:"id"`
	Session         string  `json:"session,omitempty"`
	Prompt          int     `json:"prompt_tokens"`
	Output          int     `json:"output_tokens"`
	ArrivalS        float64 `json:"arrival_s"`
	Target          string  `json:"target"`
	PredictedTarget string  `json:"predicted_target"`
	TTFTS           float64 `json:"ttft_s"`
	PredictedTTFTS  float64 `json:"predicted_ttft_s"`
	QueueS          float64 `json:"queue_s"`
	PrefillS        float64 `json:"prefill_s"`
	TailS           float64 `json:"transfer_tail_s"`
	FirstStepS      float64 `json:"first_step_s"`
	// LateMarkS is how long after the client's first token the
	// coordinator marked the job's last part (lateMark; 0: in time).
	LateMarkS float64 `json:"late_mark_s"`
	DecodeS   float64 `json:"decode_s"`
	// GroupDecodeS is the decode group's own measure of first to last
	// token (the coordinator's timing).
	GroupDecodeS float64 `json:"group_decode_s"`
	Passes       int     `json:"passes"`
	Bytes        int64   `json:"bytes"`
	Failed       string  `json:"failed,omitempty"`
	// Events are when the job entered each state, in seconds since the
	// coordinator accepted it; Reason is the router's.
	Events          map[string]float64 `json:"events_s,omitempty"`
	Reason          string             `json:"reason,omitempty"`
	PredictedReason string             `json:"predicted_reason,omitempty"`
}

// writeJobs writes every replayed job, measured next to predicted, as JSON
// Lines.
func writeJobs(path string, runs []e2eRun) error {
	var b strings.Builder
	for _, r := range runs {
		for i, j := range r.measured.Jobs {
			var p sim.JobResult // the same job in the same round
			if i < len(r.predicted.Jobs) {
				p = r.predicted.Jobs[i]
			}
			ev := map[string]float64{}
			for _, e := range r.jobs[i].Events {
				if _, ok := ev[string(e.State)]; !ok && !e.Submitted.IsZero() {
					ev[string(e.State)] = e.Time.Sub(e.Submitted).Seconds()
				}
			}
			x := e2eJob{Policy: string(r.policy), Round: 1 + i/max(r.perRound, 1), ID: j.ID, Session: j.Session, Prompt: j.Prompt, Output: j.Output, ArrivalS: j.Arrival.Seconds(),
				Target: string(j.Target), PredictedTarget: string(p.Target), TTFTS: j.TTFT.Seconds(), PredictedTTFTS: p.TTFT.Seconds(),
				QueueS: j.Queue.Seconds(), PrefillS: j.Prefill.Seconds(), TailS: j.TransferTail.Seconds(), FirstStepS: j.FirstStep.Seconds(), LateMarkS: lateMark(j).Seconds(),
				DecodeS: (j.Done - j.FirstToken).Seconds(), Passes: j.Passes, Bytes: j.Bytes, Failed: j.Refused,
				Events: ev, Reason: j.Decision.Reason, PredictedReason: p.Decision.Reason}
			if t := r.jobs[i].Final.Timing; t != nil {
				x.GroupDecodeS = t.Decode.Seconds()
			}
			if err := report.JSONLine(&b, x); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// e2ePass is one weight pass in passes.jsonl.
type e2ePass struct {
	Policy    string  `json:"policy"`
	Source    string  `json:"source"` // measured or predicted
	Index     int     `json:"index"`
	StartS    float64 `json:"start_s"`
	WallS     float64 `json:"wall_s"`
	Jobs      int     `json:"jobs"`
	Tokens    int     `json:"tokens"`
	ReadS     float64 `json:"read_s"`
	ComputeS  float64 `json:"compute_s"`
	ReadWaitS float64 `json:"read_wait_s"`
	Depth     int     `json:"depth"`
}

// writePasses writes every weight pass, measured and predicted, as JSON
// Lines.
func writePasses(path string, runs []e2eRun) error {
	var b strings.Builder
	for _, r := range runs {
		for _, src := range []struct {
			name string
			r    *sim.Result
		}{{"measured", r.measured}, {"predicted", r.predicted}} {
			for _, p := range src.r.Passes {
				x := e2ePass{Policy: string(r.policy), Source: src.name, Index: p.Index, StartS: p.Start.Seconds(), WallS: (p.End - p.Start).Seconds(),
					Jobs: p.Jobs, Tokens: p.Tokens, ReadS: p.Read.Seconds(), ComputeS: p.Compute.Seconds(), ReadWaitS: p.ReadWait.Seconds(), Depth: p.Depth}
				if err := report.JSONLine(&b, x); err != nil {
					return err
				}
			}
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
