package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tandem-inference/tandem/bench/sim"
	"github.com/tandem-inference/tandem/bench/workload"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/router"
)

// probeLengths are the prompt lengths of the probe jobs: the shortest
// (one token to prefill: the control plane alone) up to a few chunks.
var probeLengths = []int{2, 64, 256, 1024}

// probeGap is the idle time before each probe job: a workload's jobs
// arrive at an idle system more often than not, and an idle machine takes
// longer to answer (parked threads, cold caches) than one kept busy.
const probeGap = 250 * time.Millisecond

// e2eProbe is what the probe jobs measured on the idle system: what bench
// calibrate cannot see from its isolated measurements.
type e2eProbe struct {
	// Policy and Round name the replay the probe came before.
	Policy string `json:"before_policy"`
	Round  int    `json:"round"`
	Reps   int    `json:"reps"`
	// OtherLoad is the share of the machine other processes used while the
	// probe ran (absent where unknown).
	OtherLoad *float64 `json:"other_load,omitempty"`
	// ControlPlane is the latency the control plane adds on each path:
	// the probes' TTFT less their simulated work (median over the lengths).
	ControlPlane sim.ControlPlane `json:"control_plane"`
	// PrefillFit is the prefill box's compute fitted to the worker's
	// passes (the profile's rates scaled; see sim.FitPasses); GroupFit the
	// decode group's prefill fitted to the local probes (sim.FitGroup) and
	// DecodeStepMS its measured decode step.
	PrefillFit   probeFit `json:"prefill_fit"`
	GroupFit     probeFit `json:"group_fit"`
	DecodeStepMS float64  `json:"decode_step_ms"`
	// PrefillFactor and GroupFactor are the fitted compute times over the
	// profile's (MoE work; 1.2 is 20% slower).
	PrefillFactor float64 `json:"prefill_factor"`
	GroupFactor   float64 `json:"group_factor"`
	// Points are the probe jobs' median TTFT against the simulator's idle
	// TTFT with the profile alone and with the probe's figures.
	Points []probePoint `json:"points"`
}

type probeFit struct {
	Rates      sim.Compute `json:"gflops"`
	OverheadMS float64     `json:"layer_overhead_ms"`
	Residual   float64     `json:"worst_residual"`
}

type probePoint struct {
	Path     string  `json:"path"`
	Prompt   int     `json:"prompt_tokens"`
	Measured float64 `json:"measured_s"`
	Profile  float64 `json:"profile_s"`
	Probed   float64 `json:"probed_s"`
	// PassCompute is the remote probe's median pass compute (seconds).
	PassCompute float64 `json:"pass_compute_s,omitempty"`
}

// probeOutput is the tokens each local probe generates, to time the decode
// step.
const probeOutput = 8

// runProbe runs single jobs one at a time on the idle system, each prompt
// length reps times each way, and returns the setup the simulator predicts
// the workload with: the profile's, with the prefill worker's pass compute,
// the decode group's prefill and step as the probes measured them, and the
// control plane's latency.
func runProbe(ctx context.Context, d *deployment, nc *nats.Conn, setup sim.Setup, reps, vocab int, key string, timeout time.Duration) (sim.Setup, *e2eProbe, error) {
	pr := &e2eProbe{Reps: reps}
	ps, err := probeJobs(ctx, d, nc, reps, vocab, key, timeout)
	if err != nil {
		return sim.Setup{}, nil, err
	}
	pr.OtherLoad = ps.otherLoad
	probed := setup
	if probed.Prefill, err = ps.fitPrefill(setup, pr); err != nil {
		return sim.Setup{}, nil, err
	}
	if probed.Decode, err = ps.fitGroup(setup, pr); err != nil {
		return sim.Setup{}, nil, err
	}
	if err := ps.controlPlane(ctx, probed, pr); err != nil {
		return sim.Setup{}, nil, err
	}
	cpl := pr.ControlPlane
	probed.Control = &cpl
	if pr.Points, err = ps.points(ctx, setup, probed); err != nil {
		return sim.Setup{}, nil, err
	}
	return probed, pr, nil
}

// probeSamples is what the probe jobs measured: each path's TTFT and the
// remote probes' pass compute by prompt length (seconds), the local
// probes' decode steps, and the share of the machine other processes used
// meanwhile (nil where unknown).
type probeSamples struct {
	ttft      map[cp.Policy]map[int][]float64
	compute   map[int][]float64
	steps     []float64
	otherLoad *float64
}

// probeJobs runs the probe jobs, each prompt length reps times each way,
// one at a time, each after probeGap of idle time.
func probeJobs(ctx context.Context, d *deployment, nc *nats.Conn, reps, vocab int, key string, timeout time.Duration) (*probeSamples, error) {
	lm := startLoad()
	ps := &probeSamples{ttft: map[cp.Policy]map[int][]float64{cp.PolicyLocal: {}, cp.PolicyRemote: {}}, compute: map[int][]float64{}}
	for rep := range reps {
		for _, n := range probeLengths {
			for _, p := range []cp.Policy{cp.PolicyLocal, cp.PolicyRemote} {
				job := workload.Job{ID: fmt.Sprintf("probe-%s-%d-%d", p, n, rep), Arrival: probeGap, Prompt: n, Output: 1}
				if p == cp.PolicyLocal {
					job.Output = probeOutput
				}
				ms, _, err := replay(ctx, nc, []workload.Job{job}, p, vocab, key, timeout, false)
				if err != nil {
					return nil, err
				}
				m := ms[0]
				if m.Err != nil {
					return nil, fmt.Errorf("e2e: probe job (%s, %d tokens): %w", p, n, m.Err)
				}
				ps.ttft[p][n] = append(ps.ttft[p][n], m.FirstToken.Sub(m.Submitted).Seconds())
				if t := m.Final.Timing; t != nil && m.Tokens > 1 && t.Decode > 0 {
					ps.steps = append(ps.steps, t.Decode.Seconds()/float64(m.Tokens-1))
				}
				for _, pass := range d.takePasses() {
					if len(pass.Rep.Plan.Pieces) == 1 && pass.Rep.Plan.Pieces[0].ID == m.JobID {
						ps.compute[n] = append(ps.compute[n], pass.Rep.Stats.Compute.Seconds())
					}
				}
			}
		}
	}
	if share, ok := lm.Others(); ok {
		ps.otherLoad = &share
	}
	return ps, nil
}

// fitPrefill is the setup's prefill box with its compute fitted to the
// prefill worker's passes (sim.FitPasses); the fit goes into pr.
func (ps *probeSamples) fitPrefill(setup sim.Setup, pr *e2eProbe) (*sim.PrefillBox, error) {
	var samples []sim.PassSample
	for _, n := range probeLengths {
		if len(ps.compute[n]) == 0 {
			return nil, fmt.Errorf("e2e: no weight pass was reported for the %d-token remote probes", n)
		}
		samples = append(samples, sim.PassSample{Tokens: n - 1, Seconds: median(ps.compute[n])})
	}
	fit, err := sim.FitPasses(setup.Model.Cfg, setup.Prefill.Compute, samples)
	if err != nil {
		return nil, err
	}
	pr.PrefillFit = probeFit{Rates: fit.Rates, OverheadMS: fit.OverheadMS, Residual: fit.WorstResidual}
	pr.PrefillFactor = setup.Prefill.Compute.MoE / fit.Rates.MoE
	box := *setup.Prefill
	box.Compute, box.LayerOverheadMS = fit.Rates, fit.OverheadMS
	return &box, nil
}

// fitGroup is the setup's decode group with its step as measured and its
// prefill fitted to the local probes (sim.FitGroup): each prompt's TTFT
// over the shortest one's, plus a step (a probe's TTFT holds the control
// plane's latency; the shortest prompt is all latency and a step). The fit
// goes into pr.
func (ps *probeSamples) fitGroup(setup sim.Setup, pr *e2eProbe) (*sim.DecodeGroup, error) {
	if len(ps.steps) == 0 {
		return nil, errors.New("e2e: the local probes reported no decode time")
	}
	step := median(ps.steps)
	local := ps.ttft[cp.PolicyLocal]
	short := probeLengths[0]
	var gs []sim.GroupSample
	for _, n := range probeLengths[1:] {
		// (A noisy shortest probe can outlast a short one: at least a
		// microsecond of prefill.)
		d := max(1e-6, median(local[n])-median(local[short]))
		gs = append(gs, sim.GroupSample{Prompt: n, Seconds: d + step})
	}
	group := *setup.Decode
	chunk := group.PrefillChunk
	if chunk <= 0 {
		chunk = 512
	}
	gf, err := sim.FitGroup(setup.Model.Cfg, setup.Prefill.Compute, chunk, step, gs)
	if err != nil {
		return nil, err
	}
	pr.GroupFit = probeFit{Rates: gf.Rates, OverheadMS: gf.OverheadMS, Residual: gf.WorstError}
	if c := setup.Decode.Compute; c != nil {
		pr.GroupFactor = c.MoE / gf.Rates.MoE
	}
	pr.DecodeStepMS = step * 1e3
	rates := gf.Rates
	group.PrefillRate, group.Compute, group.LayerOverheadMS, group.DecodeStepMS = nil, &rates, gf.OverheadMS, step*1e3
	return &group, nil
}

// controlPlane sets pr's control-plane latency on each path: what the
// probes took beyond their simulated work on probed (the median over the
// prompt lengths).
func (ps *probeSamples) controlPlane(ctx context.Context, probed sim.Setup, pr *e2eProbe) error {
	latency := func(p cp.Policy) (float64, error) {
		var d []float64
		for _, n := range probeLengths {
			w, err := idleTTFT(ctx, probed, router.Policy(p), n)
			if err != nil {
				return 0, err
			}
			d = append(d, median(ps.ttft[p][n])-w)
		}
		return 1e3 * max(0, median(d)), nil
	}
	var err error
	if pr.ControlPlane.LocalMS, err = latency(cp.PolicyLocal); err != nil {
		return err
	}
	pr.ControlPlane.RemoteMS, err = latency(cp.PolicyRemote)
	return err
}

// points sets each probe's median TTFT against the simulator's idle TTFT
// with the profile alone (setup) and with the probe's figures (probed).
func (ps *probeSamples) points(ctx context.Context, setup, probed sim.Setup) ([]probePoint, error) {
	var pts []probePoint
	for _, p := range []cp.Policy{cp.PolicyLocal, cp.PolicyRemote} {
		for _, n := range probeLengths {
			a, err := idleTTFT(ctx, setup, router.Policy(p), n)
			if err != nil {
				return nil, err
			}
			b, err := idleTTFT(ctx, probed, router.Policy(p), n)
			if err != nil {
				return nil, err
			}
			pt := probePoint{Path: string(p), Prompt: n, Measured: median(ps.ttft[p][n]), Profile: a, Probed: b}
			if p == cp.PolicyRemote {
				pt.PassCompute = median(ps.compute[n])
			}
			pts = append(pts, pt)
		}
	}
	return pts, nil
}

// idleTTFT is the simulator's TTFT of one prompt of n tokens under policy
// p on the idle setup s, in seconds.
func idleTTFT(ctx context.Context, s sim.Setup, p router.Policy, n int) (float64, error) {
	j, err := sim.Idle(ctx, s, p, n)
	return j.TTFT.Seconds(), err
}

// median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
