package router

import (
	"sync"
	"time"
)

// Estimator keeps the cost model's rates as exponentially weighted moving
// averages of measured job figures, starting from seed values (config, or
// docs/HARDWARE.md for the real cluster). Safe for concurrent use.
type Estimator struct {
	alpha float64

	mu sync.Mutex
	r  Rates
}

// NewEstimator starts from seed; alpha in (0, 1] weighs each new
// measurement (0 means 0.2).
func NewEstimator(seed Rates, alpha float64) *Estimator {
	if !(alpha > 0 && alpha <= 1) {
		alpha = 0.2
	}
	return &Estimator{alpha: alpha, r: seed}
}

// Rates returns the current estimates.
func (e *Estimator) Rates() Rates {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.r
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

// ObservePass records a finished weight pass: the time spent reading
// weights (the floor) and computing, and the tokens it carried.
func (e *Estimator) ObservePass(read, compute time.Duration, tokens int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if read > 0 {
		e.r.PassFloor = e.mixDur(e.r.PassFloor, read)
	}
	if compute > 0 && tokens > 0 {
		e.r.PrefillTokPerS = e.mix(e.r.PrefillTokPerS, float64(tokens)/compute.Seconds())
	}
}

// ObserveLocalPrefill records a prefill done by the decode group.
func (e *Estimator) ObserveLocalPrefill(tokens int, d time.Duration) {
	if tokens <= 0 || d <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.r.LocalPrefillTokPerS = e.mix(e.r.LocalPrefillTokPerS, float64(tokens)/d.Seconds())
}

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
