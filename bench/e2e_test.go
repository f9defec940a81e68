package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/bench/sim"
	"github.com/tandem-inference/tandem/bench/workload"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/prefill-worker/executor"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
	"github.com/tandem-inference/tandem/prefill-worker/scheduler"
)

func TestE2EPoliciesFlag(t *testing.T) {
	ps, err := e2ePolicies("auto, local,auto")
	if err != nil || len(ps) != 2 || ps[0] != router.Auto || ps[1] != router.Local {
		t.Fatalf("policies %v, %v", ps, err)
	}
	for in, want := range map[string]string{"threshold": "simulated", "fast": "unknown policy", " , ": "no policy"} {
		if _, err := e2ePolicies(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--policies %q: %v, want an error saying %q", in, err, want)
		}
	}
}

func TestMeasuredResultBreaksDownEachJob(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	remote := measured{Job: workload.Job{ID: "r", Prompt: 100, Output: 4}, JobID: "k-r", Submitted: at(10), FirstToken: at(60), LastToken: at(61), Tokens: 4, Bytes: 5000,
		Final: cp.JobEvent{State: cp.StateDone, Route: &cp.RouteDecision{Policy: cp.PolicyRemote, Target: cp.TargetRemote, Reason: "policy remote"},
			Timing: &cp.Timing{Queue: 2 * time.Millisecond, PassWait: 3 * time.Millisecond, Prefill: 30 * time.Millisecond, TransferTail: 5 * time.Millisecond, Decode: 9 * time.Millisecond}}}
	local := measured{Job: workload.Job{ID: "l", Prompt: 20, Output: 1}, JobID: "k-l", Submitted: at(20), FirstToken: at(32), LastToken: at(32), Tokens: 1,
		Final: cp.JobEvent{State: cp.StateDone, Route: &cp.RouteDecision{Policy: cp.PolicyLocal, Target: cp.TargetLocal}, Timing: &cp.Timing{Queue: time.Millisecond, Prefill: 10 * time.Millisecond}}}
	failed := measured{Job: workload.Job{ID: "f", Arrival: time.Second, Prompt: 5, Output: 1}, Err: context.DeadlineExceeded}
	passes := []passRecord{{End: at(48), Rep: scheduler.PassReport{Plan: planner.Plan{Tokens: 99, Pieces: []planner.Piece{{ID: "k-r", Lo: 0, Hi: 99, Final: true}}},
		Stats: statsOf(30*time.Millisecond, 28*time.Millisecond)}}}
	r := measuredResult(router.Remote, t0, []measured{remote, local, failed}, passes)

	rj, lj, fj := r.Jobs[0], r.Jobs[1], r.Jobs[2]
	if rj.TTFT != 50*time.Millisecond || rj.Queue != 5*time.Millisecond || rj.Prefill != 30*time.Millisecond || rj.TransferTail != 5*time.Millisecond ||
		rj.FirstStep != 10*time.Millisecond || rj.Passes != 1 || rj.Bytes != 5000 || rj.Target != router.TargetRemote {
		t.Fatalf("remote job %+v", rj)
	}
	if rj.Arrival != 10*time.Millisecond || rj.FirstToken != 60*time.Millisecond || rj.Done != 69*time.Millisecond {
		t.Fatalf("remote job's times %+v: want the decode group's 9 ms of decoding after the first token", rj)
	}
	if lj.TTFT != 12*time.Millisecond || lj.Prefill != 10*time.Millisecond || lj.Queue != 2*time.Millisecond || lj.Target != router.TargetLocal {
		t.Fatalf("local job %+v", lj)
	}
	if fj.Refused == "" || fj.Arrival != time.Second {
		t.Fatalf("failed job %+v", fj)
	}
	for _, j := range []sim.JobResult{rj, lj} {
		if d := lateMark(j); d != 0 {
			t.Fatalf("job %s marked in time: late by %v", j.ID, d)
		}
	}
	if len(r.Passes) != 1 || r.Passes[0].Jobs != 1 || r.Passes[0].Start != 18*time.Millisecond || r.Passes[0].End != 48*time.Millisecond {
		t.Fatalf("passes %+v", r.Passes)
	}
	s := sim.Summarize(r)
	if s.Completed != 2 || s.Refused != 1 || s.Remote != 1 || s.BytesMoved != 5000 || s.JobsPerPass != 1 {
		t.Fatalf("summary %+v", s)
	}

	m := mergeResults([]*sim.Result{r, r})
	if len(m.Jobs) != 6 || m.End != 2*r.End || m.Jobs[3].Arrival != r.End+rj.Arrival || len(m.Passes) != 2 || m.Passes[1].Index != 2 {
		t.Fatalf("merged: end %v (one run %v), %d jobs, passes %+v", m.End, r.End, len(m.Jobs), m.Passes)
	}
	if ms := sim.Summarize(m); ms.TTFTP50 != s.TTFTP50 || ms.Completed != 4 {
		t.Fatalf("merged summary %+v against %+v", ms, s)
	}
}

// TestMeasuredResultKeepsLateMarks: the coordinator marks a remote job's
// commit, or a local job's first token, when the worker's report reaches
// it, which can be after the client has the first token. The parts are
// reported as measured, not cut to the TTFT: first step is 0, the excess
// is the job's late mark, and the breakdown table and jobs.jsonl say so.
func TestMeasuredResultKeepsLateMarks(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Remote: 40 ms to the pass (2 + 3 ms), 30 ms of pass, a 10 ms tail:
	// 45 ms of parts against the client's 42 ms TTFT.
	remote := measured{Job: workload.Job{ID: "r", Prompt: 100, Output: 2}, JobID: "k-r", Submitted: at(0), FirstToken: at(42), LastToken: at(43), Tokens: 2,
		Final: cp.JobEvent{State: cp.StateDone, Route: &cp.RouteDecision{Policy: cp.PolicyRemote, Target: cp.TargetRemote},
			Timing: &cp.Timing{Queue: 2 * time.Millisecond, PassWait: 3 * time.Millisecond, Prefill: 30 * time.Millisecond, TransferTail: 10 * time.Millisecond}}}
	// Local: the group's 15 ms against the client's 12 ms TTFT.
	local := measured{Job: workload.Job{ID: "l", Prompt: 20, Output: 1}, JobID: "k-l", Submitted: at(0), FirstToken: at(12), LastToken: at(12), Tokens: 1,
		Final: cp.JobEvent{State: cp.StateDone, Route: &cp.RouteDecision{Policy: cp.PolicyLocal, Target: cp.TargetLocal}, Timing: &cp.Timing{Prefill: 15 * time.Millisecond}}}
	// In time: 20 ms of parts, 25 ms TTFT.
	inTime := measured{Job: workload.Job{ID: "i", Prompt: 50, Output: 1}, JobID: "k-i", Submitted: at(0), FirstToken: at(25), LastToken: at(25), Tokens: 1,
		Final: cp.JobEvent{State: cp.StateDone, Route: &cp.RouteDecision{Policy: cp.PolicyRemote, Target: cp.TargetRemote},
			Timing: &cp.Timing{Queue: time.Millisecond, Prefill: 15 * time.Millisecond, TransferTail: 4 * time.Millisecond}}}
	r := measuredResult(router.Remote, t0, []measured{remote, local, inTime}, nil)
	rj, lj, ij := r.Jobs[0], r.Jobs[1], r.Jobs[2]
	if rj.TTFT != 42*time.Millisecond || rj.Queue != 5*time.Millisecond || rj.Prefill != 30*time.Millisecond || rj.TransferTail != 10*time.Millisecond || rj.FirstStep != 0 {
		t.Fatalf("remote job committed late: %+v, want its parts as measured and no first step", rj)
	}
	if d := lateMark(rj); d != 3*time.Millisecond {
		t.Fatalf("remote job's commit marked %v after its first token, want 3ms", d)
	}
	if lj.TTFT != 12*time.Millisecond || lj.Prefill != 15*time.Millisecond || lj.Queue != 0 || lateMark(lj) != 3*time.Millisecond {
		t.Fatalf("local job marked late: %+v (late by %v), want its 15 ms prefill kept and late by 3ms", lj, lateMark(lj))
	}
	if ij.FirstStep != 5*time.Millisecond || lateMark(ij) != 0 || ij.Queue+ij.Prefill+ij.TransferTail+ij.FirstStep != ij.TTFT {
		t.Fatalf("job marked in time: %+v", ij)
	}
	if n, worst := lateMarks(r); n != 2 || worst != 3*time.Millisecond {
		t.Fatalf("late marks: %d, worst %v; want 2 and 3ms", n, worst)
	}

	s := sim.Summarize(r)
	out := &e2eOutput{Policies: map[string]e2ePolicy{string(router.Remote): {Summary: s}}, Predicted: map[string]sim.Summary{string(router.Remote): s}}
	run := e2eRun{policy: router.Remote, jobs: []measured{remote, local, inTime}, measured: r, predicted: r}
	tables := e2eTables(out, []e2eRun{run})
	bt := tables[2]
	if last := bt.Rows[0][len(bt.Rows[0])-1]; !strings.Contains(last, "2 of 3") || !strings.Contains(last, report.Duration(0.003)) {
		t.Fatalf("breakdown %v: want the 2 late jobs of 3 and the 3 ms", bt.Rows[0])
	}
	path := filepath.Join(t.TempDir(), "jobs.jsonl")
	if err := writeJobs(path, []e2eRun{run}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var late []float64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var j e2eJob
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			t.Fatal(err)
		}
		late = append(late, j.LateMarkS)
	}
	if len(late) != 3 || math.Abs(late[0]-0.003) > 1e-12 || math.Abs(late[1]-0.003) > 1e-12 || late[2] != 0 {
		t.Fatalf("jobs.jsonl late marks %v, want [0.003 0.003 0]", late)
	}
}

// TestDeploymentReplaysThroughTheControlPlane starts the whole system on
// the tiny model with a rate-limited link, replays a small workload both
// ways and checks what the bench reads back: routes, passes, bytes through
// the proxies, timings that add up; then probes it once.
func TestDeploymentReplaysThroughTheControlPlane(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 0)
	m, err := sim.LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := sim.LoadProfile("local")
	if err != nil {
		t.Fatal(err)
	}
	setup := sim.Setup{Name: "local", Model: m, Prefill: prof.Prefill, Decode: prof.Decode, Link: prof.Link}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := startDeployment(ctx, deployOptions{ModelDir: dir, Ranks: 2, Threads: 1, PrefillBudget: 256 << 20, LinkRate: 50e6,
		Rates: sim.SeedRates(setup, 1024)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	nc, err := d.c.ConnectAs(ctx, cp.PrincipalCoordinator, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	jobs := []workload.Job{{ID: "a", Prompt: 40, Output: 3}, {ID: "b", Arrival: 5 * time.Millisecond, Prompt: 300, Output: 2},
		{ID: "c", Arrival: 10 * time.Millisecond, Prompt: 2, Output: 1}}
	for _, p := range []router.Policy{router.Remote, router.Local} {
		ms, t0, err := replay(ctx, nc, jobs, cp.Policy(p), d.c.Model.VocabSize, "test-"+string(p), time.Minute, false)
		if err != nil {
			t.Fatal(err)
		}
		r := measuredResult(p, t0, ms, d.takePasses())
		for i, j := range r.Jobs {
			if j.Refused != "" {
				t.Fatalf("%s: job %s: %s", p, j.ID, j.Refused)
			}
			if string(j.Target) != string(p) || j.TTFT <= 0 || ms[i].Tokens != j.Output {
				t.Fatalf("%s: job %+v (%d tokens)", p, j, ms[i].Tokens)
			}
			// The coordinator marked each part, and the breakdown has its
			// figures uncut (they may add up to more than the client's
			// TTFT: lateMark).
			tm := ms[i].Final.Timing
			if tm == nil || j.Prefill != tm.Prefill || j.Prefill <= 0 || tm.FirstToken <= 0 {
				t.Fatalf("%s: job %s: prefill %v, the coordinator measured %+v", p, j.ID, j.Prefill, tm)
			}
			if p == router.Remote && (j.Queue != tm.Queue+tm.PassWait || j.Queue <= 0 || j.TransferTail != tm.TransferTail) {
				t.Fatalf("remote job %s: queue %v, tail %v; the coordinator measured %+v", j.ID, j.Queue, j.TransferTail, tm)
			}
			if late := lateMark(j); late > 0 {
				t.Logf("%s: job %s's last part marked %v after its first token (parts %v, TTFT %v)", p, j.ID, late,
					j.Queue+j.Prefill+j.TransferTail, j.TTFT)
			}
			if p == router.Remote && (j.Bytes <= 0 || j.Passes != 1 || j.Bytes != m.StateBytes(j.Prompt-1)) {
				t.Fatalf("remote job %s moved %d bytes in %d passes, want its state of %d bytes in one", j.ID, j.Bytes, j.Passes, m.StateBytes(j.Prompt-1))
			}
		}
		if s := sim.Summarize(r); p == router.Remote && (s.Passes < 1 || s.JobsPerPass < 1) {
			t.Fatalf("remote summary %+v", s)
		}
	}
	var through int64
	for _, px := range d.proxies {
		through += px.Stats().BytesUp
	}
	if want := m.StateBytes(39) + m.StateBytes(299) + m.StateBytes(1); through < want {
		t.Fatalf("%d bytes went through the rate-limited link, want at least the states' %d", through, want)
	}

	if err := d.resetRouter(ctx); err != nil {
		t.Fatal(err)
	}
	probed, pr, err := runProbe(ctx, d, nc, setup, 1, d.c.Model.VocabSize, "test-probe", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if probed.Control == nil || pr.DecodeStepMS <= 0 || len(pr.Points) != 2*len(probeLengths) || probed.Prefill.Compute.MoE <= 0 || probed.Decode.Compute == nil {
		t.Fatalf("probe %+v, setup %+v", pr, probed)
	}
	if setup.Control != nil || setup.Prefill.LayerOverheadMS != prof.Prefill.LayerOverheadMS {
		t.Fatal("the probe changed the profile's setup")
	}
}

func statsOf(wall, compute time.Duration) executor.Stats {
	return executor.Stats{Wall: wall, Compute: compute}
}

// TestPredRatiosAndLadder: the ratio of each job's measured TTFT to the
// router's prediction for the path it took, as percentiles; jobs without
// a prediction or that failed are left out; the ladder workload's flags.
func TestPredRatiosAndLadder(t *testing.T) {
	t0 := time.Now()
	job := func(n int, target cp.Target, local, remote, took time.Duration) measured {
		return measured{Job: workload.Job{Prompt: n}, Submitted: t0, FirstToken: t0.Add(took),
			Final: cp.JobEvent{Route: &cp.RouteDecision{Target: target, PredictedLocal: local, PredictedRemote: remote}}}
	}
	ms := []measured{
		job(64, cp.TargetLocal, time.Second, 9*time.Second, 800*time.Millisecond), // 0.8
		job(256, cp.TargetRemote, 9*time.Second, 2*time.Second, 2*time.Second),    // 1.0
		job(1024, cp.TargetRemote, time.Second, 4*time.Second, 5*time.Second),     // 1.25
		job(4096, cp.TargetLocal, 0, 4*time.Second, 5*time.Second),                // no local prediction
		{Job: workload.Job{Prompt: 16384}, Err: os.ErrDeadlineExceeded},           // failed
	}
	var pol e2ePolicy
	predRatios(&pol, ms)
	if len(pol.PredJobs) != 3 || pol.PredJobs[1].Target != "remote" || pol.PredJobs[2].Ratio != 1.25 {
		t.Fatalf("jobs %+v", pol.PredJobs)
	}
	if pol.PredRatioP50 != 1 || !(pol.PredRatioP10 >= 0.8 && pol.PredRatioP10 < 1) || !(pol.PredRatioP90 > 1 && pol.PredRatioP90 <= 1.25) {
		t.Fatalf("p10 %v p50 %v p90 %v", pol.PredRatioP10, pol.PredRatioP50, pol.PredRatioP90)
	}
	// Parts: a remote job whose pass took 1.5 s against 1 s predicted, the
	// rest as predicted; a local one whose prefill ran as predicted and
	// whose control plane took 0.3 s against 0.1 s.
	rj := job(2048, cp.TargetRemote, 0, 2*time.Second, 2500*time.Millisecond)
	rj.Final.Route.PrefillWorker = "pf"
	rj.Final.Route.Parts = &cp.PredictedParts{QueueWait: 100 * time.Millisecond, Pass: time.Second, TransferTail: 200 * time.Millisecond, FirstStep: 700 * time.Millisecond}
	rj.Final.Timing = &cp.Timing{Queue: 40 * time.Millisecond, PassWait: 60 * time.Millisecond, Prefill: 1500 * time.Millisecond, TransferTail: 200 * time.Millisecond}
	lj := job(64, cp.TargetLocal, 800*time.Millisecond, 0, time.Second)
	lj.Final.Route.Parts = &cp.PredictedParts{Prefill: 600 * time.Millisecond, FirstStep: 100 * time.Millisecond, Overhead: 100 * time.Millisecond}
	lj.Final.Timing = &cp.Timing{Prefill: 700 * time.Millisecond}
	var parts e2ePolicy
	predRatios(&parts, []measured{rj, lj, job(64, cp.TargetLocal, time.Second, 0, time.Second)})
	want := map[string][2]float64{"queue": {0.2, 0.4}, "pass": {1, 1.5}, "transfer_tail": {0.2, 0.2}, "first_step": {0.7, 0.7}, "prefill": {0.7, 0.7}}
	if len(parts.PredJobs) != 3 || len(parts.PredJobs[0].Parts) != 4 || len(parts.PredJobs[1].Parts) != 2 || parts.PredJobs[2].Parts != nil || len(parts.PartResiduals) != len(want) {
		t.Fatalf("parts: %+v, residuals %+v", parts.PredJobs, parts.PartResiduals)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for _, r := range parts.PartResiduals {
		w := want[r.Part]
		if !near(r.PredictedS, w[0]) || !near(r.MeasuredS, w[1]) {
			t.Errorf("part %s: predicted %v measured %v, want %v", r.Part, r.PredictedS, r.MeasuredS, w)
		}
	}
	if r := parts.PartResiduals[1]; r.Part != "pass" || r.Jobs != 1 || !near(r.ResidualP50, 0.5) || !near(r.ResidualMax, 0.5) {
		t.Errorf("the pass's residual: %+v", r)
	}
	jobs, name, err := ladderJobs("64, 1024,16384")
	if err != nil || len(jobs) != 3 || jobs[2].Prompt != 16384 || !strings.Contains(name, "each alone") {
		t.Fatalf("ladder %v %q %v", jobs, name, err)
	}
	for _, bad := range []string{"1", "x", "64,0", "2000000"} {
		if _, _, err := ladderJobs(bad); err == nil || !strings.Contains(err.Error(), "--ladder") {
			t.Errorf("ladder %q: %v", bad, err)
		}
	}
}

// TestLoadAverage: /proc/loadavg's first figure is read, anything else is
// refused naming the file; samples merge into mean, min and max; a
// sampler stopped at once still has its first and last samples where the
// machine tells its load.
func TestLoadAverage(t *testing.T) {
	if v, err := parseLoadAvg([]byte("12.50 9.03 16.96 7/156 1142\n")); err != nil || v != 12.5 {
		t.Fatalf("parse: %v %v", v, err)
	}
	for _, bad := range []string{"", "  \n", "x 1 2", "-1 0 0", "NaN 1 1", "+Inf 1 1"} {
		if _, err := parseLoadAvg([]byte(bad)); err == nil || !strings.Contains(err.Error(), "/proc/loadavg") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	var a loadAverage
	a.merge(loadAverage{})
	if a.Samples != 0 {
		t.Fatalf("an empty merge counted: %+v", a)
	}
	for _, v := range []float64{4, 2, 9} {
		a.add(v)
	}
	b := loadAverage{Min: 1, Mean: 3, Max: 3, Samples: 1}
	a.merge(b)
	if a.Min != 1 || a.Max != 9 || a.Mean != 4.5 || a.Samples != 4 || a.String() != "4.5 (1.0-9.0)" {
		t.Fatalf("merged %+v %q", a, a)
	}
	s := sampleLoad(time.Hour)
	got, ok := s.Stop()
	if _, known := loadAvg(); known != ok || (ok && (got.Samples < 2 || got.Min > got.Max)) {
		t.Fatalf("sampler: %+v %v (load average readable: %v)", got, ok, known)
	}
	if again, _ := s.Stop(); again.Samples < got.Samples {
		t.Fatalf("a second Stop: %+v", again)
	}
}

// TestFaultCounter: phases count the faults between marks in the order
// they came, add joins a phase's counts, and the summary prices them at
// the measured cost of one; where faults cannot be read, nothing is
// counted or said.
func TestFaultCounter(t *testing.T) {
	c := newFaultCounter()
	_, known := minorFaults()
	if known != c.ok {
		t.Fatalf("counter ok %v, faults readable %v", c.ok, known)
	}
	debug.FreeOSMemory() // so that the buffer below is memory first touched, not a reused span
	b := make([]byte, 8<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	c.mark("cold")
	c.add("local", 10)
	c.add("local", 5)
	if !known {
		if _, counted := c.counts()["cold"]; counted {
			t.Fatalf("unreadable faults counted: %v", c.counts())
		}
		return
	}
	got := c.counts()
	if got["cold"] <= 0 || got["local"] != 15 || len(c.phases) != 2 || c.phases[0] != "cold" {
		t.Fatalf("counts %v, phases %v (8 MiB touched in the cold phase)", got, c.phases)
	}
	if s := c.String(); !strings.HasPrefix(s, "; page faults: cold ") || !strings.Contains(s, ", local 15") {
		t.Fatalf("summary %q", s)
	}
	if empty := (&faultCounter{spans: map[string]int64{}}); empty.counts() != nil || empty.String() != "" {
		t.Fatalf("nothing counted: %v %q", empty.counts(), empty.String())
	}
}
