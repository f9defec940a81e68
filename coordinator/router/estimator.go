package router

import (
	"sync"
	"time"

	"github.com/tandem-inference/tandem/costmodel"
)

// Estimator keeps the cost model's rates: the pass floor, the link and the
// decode step as exponentially weighted moving averages of measured
// figures, and the compute terms of each path fitted to measured prefills
// (costmodel.Fitter), starting from seed values (config, a hardware
// profile, or docs/HARDWARE.md for the real cluster). Workers that fit
// their own terms advertise them in their heartbeats; the coordinator
// prefers those. Safe for concurrent use.
type Estimator struct {
	alpha          float64
	prefill, local *costmodel.Fitter

	mu sync.Mutex
	r  Rates
}

// NewEstimator starts from seed; alpha in (0, 1] weighs each new
// measurement (0 means 0.2).
func NewEstimator(seed Rates, alpha float64) *Estimator {
	if !(alpha > 0 && alpha <= 1) {
		alpha = 0.2
	}
	return &Estimator{alpha: alpha, r: seed, prefill: costmodel.NewFitter(seed.Prefill), local: costmodel.NewFitter(seed.Local)}
}

// Rates returns the current estimates.
func (e *Estimator) Rates() Rates {
	e.mu.Lock()
	r := e.r
	e.mu.Unlock()
	if c, n, _ := e.prefill.Compute(); n > 0 {
		r.Prefill = c
	}
	if c, n, _ := e.local.Compute(); n > 0 {
		r.Local = c
	}
	return r
}

func (e *Estimator) mix(old, v float64) float64 {
	if old <= 0 {
		return v
	}
	return e.alpha*v + (1-e.alpha)*old
}

func (e *Estimator) mixDur(old, v time.Duration) time.Duration {
	return time.Duration(e.mix(float64(old), float64(v)))
}

// ObserveFloor records a measured pass floor: the time to read one pass's
// weights with nothing to compute.
func (e *Estimator) ObserveFloor(floor time.Duration) {
	if floor <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.r.PassFloor = e.mixDur(e.r.PassFloor, floor)
}

// ObservePrefill records a prefill worker's measured compute inside a
// pass (the work of the pass's pieces, its layer calls, its compute time);
// ObserveLocal a decode group's measured prefill of one prompt. A sample
// that is not a measurement is ignored.
func (e *Estimator) ObservePrefill(s costmodel.Sample) { _ = e.prefill.Add(s) }

// ObserveLocal: see ObservePrefill.
func (e *Estimator) ObserveLocal(s costmodel.Sample) { _ = e.local.Add(s) }

// ObserveTransfer records bytes moved over the data plane in d.
func (e *Estimator) ObserveTransfer(bytes int64, d time.Duration) {
	if bytes <= 0 || d <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.r.LinkBytesPerS = e.mix(e.r.LinkBytesPerS, float64(bytes)/d.Seconds())
}

// ObserveDecodeStep records one decode step's duration.
func (e *Estimator) ObserveDecodeStep(d time.Duration) {
	if d <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.r.DecodeStep = e.mixDur(e.r.DecodeStep, d)
}

// ObserveOverhead records the control plane's latency on a path, as a
// finished job measured it (Overhead).
func (e *Estimator) ObserveOverhead(t Target, d time.Duration) {
	if d < 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch t {
	case TargetLocal:
		e.r.LocalOverhead = e.mixDur(e.r.LocalOverhead, d)
	case TargetRemote:
		e.r.RemoteOverhead = e.mixDur(e.r.RemoteOverhead, d)
	}
}

// Overhead is what a finished job's time to first token (ttft) spent
// beyond the parts the cost model prices from measured rates: for a remote
// job, less its measured weight pass and transfer tail and the predicted
// wait for a running pass and first decode step; for a local one, less
// the decode group's measured prefill and first step (prefill) and the
// predicted wait for the group's queue. ok is false when the job gives no
// such measure (no first token, or no predicted parts).
func Overhead(t Target, queueWait, firstStep, ttft, pass, tail, prefill time.Duration) (time.Duration, bool) {
	if ttft <= 0 {
		return 0, false
	}
	var d time.Duration
	switch t {
	case TargetRemote:
		if pass <= 0 {
			return 0, false
		}
		d = ttft - queueWait - pass - tail - firstStep
	case TargetLocal:
		if prefill <= 0 {
			return 0, false
		}
		d = ttft - queueWait - prefill
	default:
		return 0, false
	}
	return max(d, 0), true
}
