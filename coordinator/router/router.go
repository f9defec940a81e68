// Package router is the coordinator's routing (docs/ARCHITECTURE.md): for
// each job it takes the cost model's (package costmodel) predicted time to
// first token of prefilling on the GPU box and shipping the state (remote)
// against prefilling on the decode group itself (local), and picks by
// policy. It is pure logic: the coordinator feeds it the current load and
// measured rates; the simulator drives the same code.
package router

import (
	"fmt"
	"time"

	"github.com/tandem-inference/tandem/costmodel"
)

// Policy says how jobs are routed.
type Policy string

const (
	Auto      Policy = "auto"      // the smaller predicted TTFT
	Local     Policy = "local"     // always the decode group
	Remote    Policy = "remote"    // always the prefill worker (when one is up)
	Threshold Policy = "threshold" // remote above a fixed prompt length (the usual disaggregation rule, for comparison)
)

// Target is where a job's prompt is prefilled.
type Target string

const (
	TargetLocal  Target = "local"
	TargetRemote Target = "remote"
)

// The cost model's inputs and outputs (package costmodel).
type (
	Rates      = costmodel.Rates
	Load       = costmodel.Load
	Prediction = costmodel.Prediction
)

// Decision is the router's answer for one job.
type Decision struct {
	Policy Policy
	Target Target
	Local  Prediction
	Remote Prediction // zero when no prefill worker is up
	Reason string
}

// Route decides where a prompt of the given length is prefilled.
func Route(policy Policy, m *costmodel.Model, r Rates, l Load, prompt int) Decision {
	d := Decision{Policy: policy, Local: costmodel.PredictLocal(m, r, l, prompt)}
	if l.PrefillUp {
		d.Remote = costmodel.PredictRemote(m, r, l, prompt)
	}
	switch {
	case !l.PrefillUp:
		d.Target, d.Reason = TargetLocal, "no prefill worker is up"
	case policy == Local:
		d.Target, d.Reason = TargetLocal, "policy local"
	case policy == Remote:
		d.Target, d.Reason = TargetRemote, "policy remote"
	case policy == Threshold:
		d.Target = TargetLocal
		if prompt > l.Threshold {
			d.Target = TargetRemote
		}
		d.Reason = fmt.Sprintf("policy threshold: prompt %d vs %d tokens", prompt, l.Threshold)
	case d.Remote.Total < d.Local.Total:
		d.Target = TargetRemote
		d.Reason = fmt.Sprintf("remote %s < local %s", Seconds(d.Remote.Total), Seconds(d.Local.Total))
	default:
		d.Target = TargetLocal
		d.Reason = fmt.Sprintf("local %s <= remote %s", Seconds(d.Local.Total), Seconds(d.Remote.Total))
	}
	return d
}

// BreakEven is the shortest prompt for which remote beats local on an idle
// system (0 if remote never wins below maxPrompt).
func BreakEven(m *costmodel.Model, r Rates, maxPrompt int) int {
	idle := Load{PrefillUp: true}
	better := func(n int) bool {
		return costmodel.PredictRemote(m, r, idle, n).Total < costmodel.PredictLocal(m, r, idle, n).Total
	}
	if !better(maxPrompt) {
		return 0
	}
	lo, hi := 1, maxPrompt // remote's advantage grows with length: bisect
	for lo < hi {
		mid := (lo + hi) / 2
		if better(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// Unknown is the prediction for work at a rate nobody has measured.
const Unknown = costmodel.Unknown

// Seconds prints a prediction in seconds, or "unknown" for one that rests
// on an unmeasured rate.
func Seconds(d time.Duration) string {
	if d >= Unknown {
		return "unknown"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}
