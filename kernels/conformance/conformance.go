// Package conformance is the black-box suite every kernels.Backend must
// pass: each op on random inputs at Kimi K3's real widths (hidden 7168,
// latent 3584, MLA qk 192 / v 128 / latent 576, KDA heads of 128x128,
// ragged spans, several sequences per batch) against the CPU reference
// backend, then whole layers and a small whole model (last-position logits,
// greedy ids, and states prefilled on the backend that the CPU continues).
//
// Every check has a tolerance and the reason for it (Case.Why). A device
// backend is allowed BF16 inputs with fp32 accumulation where the reference
// accumulates in fp64; data movement (embedding rows, block copies, cache
// writes) must be exact. Errors are measured relative to the size of the
// reference output, so one tolerance holds at every width:
//
//	rel = ||got - want||₂ / ||want||₂        max = max|got - want| / rms(want)
//
// Run returns a Report rather than failing a test, so that the same suite
// runs under go test (the CPU backend, kernels/conformance tests) and from
// `bench validate` on a GPU machine.
package conformance

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
)

// Options choose what runs.
type Options struct {
	// Short runs every op once at K3's widths with few rows and heads, and
	// the model checks on the tiny preset: the CI subset.
	Short bool
	// Seed makes the inputs reproducible.
	Seed uint64
	// Only, when set, runs only cases whose name contains one of these.
	Only []string
	// ModelDir is a checkpoint for the layer and model checks; empty skips
	// them (Report says so).
	ModelDir string
	// Prompts is the number of prompts of the model checks (0: 4 short, 16).
	Prompts int
	// Threads of the CPU reference (0: all cores).
	Threads int
	// Absorbed also checks MLA's weight-absorbed form (absorb = true: the
	// decode group's form; prefill backends do not implement it).
	Absorbed bool
	// Log, if set, receives one line per finished case.
	Log func(string)
}

// Result is one case's outcome.
type Result struct {
	Name  string  `json:"name"`
	Shape string  `json:"shape"`
	Rel   float64 `json:"rel_l2"`
	Max   float64 `json:"max_over_rms"`
	Tol   float64 `json:"tol"`
	Why   string  `json:"why"`
	Pass  bool    `json:"pass"`
	Note  string  `json:"note,omitempty"`
	// Seconds is the backend's time on the case (excluding the reference).
	Seconds float64 `json:"seconds"`
}

// Report is a whole run.
type Report struct {
	Backend string   `json:"backend"`
	Short   bool     `json:"short"`
	Results []Result `json:"results"`
	Skipped []string `json:"skipped,omitempty"`
	// Agreement is the top-1 agreement rate of greedy ids between the
	// disaggregated path (prefill on the backend, decode on the CPU) and the
	// all-CPU path, over every generated token; -1 when not run.
	Agreement float64 `json:"greedy_agreement"`
}

// Failed lists the failing cases.
func (r *Report) Failed() []Result {
	var out []Result
	for _, c := range r.Results {
		if !c.Pass {
			out = append(out, c)
		}
	}
	return out
}

// Markdown renders the report as a table.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| case | shape | rel L2 | max/rms | tol | pass | why |\n|---|---|---|---|---|---|---|\n")
	for _, c := range r.Results {
		ok := "yes"
		if !c.Pass {
			ok = "**NO**"
		}
		note := c.Why
		if c.Note != "" {
			note += " (" + c.Note + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %.2e | %.2e | %.0e | %s | %s |\n", c.Name, c.Shape, c.Rel, c.Max, c.Tol, ok, note)
	}
	if r.Agreement >= 0 {
		fmt.Fprintf(&b, "\nGreedy top-1 agreement, disaggregated vs all-CPU: %.1f%%\n", 100*r.Agreement)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(&b, "\nskipped: %s\n", s)
	}
	return b.String()
}

// Run runs the suite on be. It returns an error only when the suite itself
// could not run (no model where one was asked for, a context ended); failing
// cases are in the report.
func Run(ctx context.Context, be kernels.Backend, opt Options) (*Report, error) {
	if opt.Seed == 0 {
		opt.Seed = 1
	}
	s := &suite{be: be, ref: cpu.New(opt.Threads), opt: opt, rep: &Report{Backend: be.Name(), Short: opt.Short, Agreement: -1}}
	for _, c := range s.opCases() {
		if err := ctx.Err(); err != nil {
			return s.rep, err
		}
		if !s.wanted(c.name) {
			continue
		}
		s.run(c)
	}
	if opt.ModelDir == "" {
		s.rep.Skipped = append(s.rep.Skipped, "layer and model checks: no model directory given")
		return s.rep, nil
	}
	if err := s.modelChecks(ctx); err != nil {
		return s.rep, err
	}
	return s.rep, nil
}

type suite struct {
	be, ref kernels.Backend
	opt     Options
	rep     *Report
}

func (s *suite) wanted(name string) bool {
	if len(s.opt.Only) == 0 {
		return true
	}
	for _, o := range s.opt.Only {
		if strings.Contains(name, o) {
			return true
		}
	}
	return false
}

// opCase is one op check: run computes the reference and the backend's
// outputs and returns them in pairs (want, got).
type opCase struct {
	name, shape string
	tol         float64 // on rel; max is held to maxFactor·tol
	why         string
	run         func(s *suite) (pairs [][2][]float32, backendTime time.Duration, note string)
}

// maxFactor bounds the worst element relative to the RMS: rounding errors
// of independent inputs spread, a wrong element does not.
const maxFactor = 20

func (s *suite) run(c opCase) {
	r := Result{Name: c.name, Shape: c.shape, Tol: c.tol, Why: c.why, Pass: true}
	pairs, d, note, err := s.try(c)
	if err != nil {
		r.Pass, r.Rel, r.Max, r.Note = false, math.Inf(1), math.Inf(1), err.Error()
		s.add(r)
		return
	}
	r.Seconds, r.Note = d.Seconds(), note
	for _, p := range pairs {
		rel, mx := compare(p[0], p[1])
		r.Rel, r.Max = math.Max(r.Rel, rel), math.Max(r.Max, mx)
	}
	if len(pairs) == 0 || !(r.Rel <= c.tol) || !(r.Max <= maxFactor*c.tol) {
		r.Pass = false
	}
	s.add(r)
}

// try runs a case, turning a panic of the backend (a shape it rejects, a
// failed launch) into the case's failure rather than the suite's end.
func (s *suite) try(c opCase) (pairs [][2][]float32, d time.Duration, note string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	pairs, d, note = c.run(s)
	return pairs, d, note, nil
}

func (s *suite) add(r Result) {
	s.rep.Results = append(s.rep.Results, r)
	if s.opt.Log != nil {
		st := "ok"
		if !r.Pass {
			st = "FAIL"
		}
		s.opt.Log(fmt.Sprintf("%-4s %-28s %-34s rel %.2e max %.2e tol %.0e %s", st, r.Name, r.Shape, r.Rel, r.Max, r.Tol, r.Note))
	}
}

// compare returns the relative L2 error and the worst element's error over
// the reference's RMS. NaN or Inf anywhere in got is an infinite error. An
// all-zero reference demands an all-zero result.
func compare(want, got []float32) (rel, mx float64) {
	if len(want) != len(got) {
		return math.Inf(1), math.Inf(1)
	}
	var ss, es, worst float64
	for i, w := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1), math.Inf(1)
		}
		e := g - float64(w)
		ss += float64(w) * float64(w)
		es += e * e
		worst = math.Max(worst, math.Abs(e))
	}
	if ss == 0 {
		if es == 0 {
			return 0, 0
		}
		return math.Inf(1), math.Inf(1)
	}
	rms := math.Sqrt(ss / float64(len(want)))
	return math.Sqrt(es / ss), worst / rms
}
