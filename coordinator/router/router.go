// Package router is the coordinator's cost model (docs/ARCHITECTURE.md):
// for each job it predicts the time to first token of prefilling on the GPU
// box and shipping the state (remote) against prefilling on the decode group
// itself (local), and picks by policy. It is pure logic: the
// coordinator feeds it the current load and measured rates; the simulator
// drives the same code.
package router

import (
	"fmt"
	"math"
	"time"
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

// Rates are the cost model's parameters: seeded from config, then updated
// from measured jobs (see Estimator).
type Rates struct {
	// PassFloor is the time one weight pass takes with no compute to hide:
	// reading every layer's weights from disk.
	PassFloor time.Duration
	// PrefillTokPerS is the prefill worker's compute rate (tokens/s) when
	// compute, not reading, bounds a pass.
	PrefillTokPerS float64
	// LocalPrefillTokPerS is the decode group's own prefill rate.
	LocalPrefillTokPerS float64
	// LinkBytesPerS and LinkRTT describe the data plane between the boxes.
	LinkBytesPerS float64
	LinkRTT       time.Duration
	// DecodeStep is one decode step of the group (the first token after
	// either prefill is one step).
	DecodeStep time.Duration
}

// Shape is what the model's state costs to move: per cached token (MLA
// latent rows over all MLA layers) and per sequence (KDA state and conv
// tails), and the same for the last layer alone, which is what is left to
// send when prefill ends.
type Shape struct {
	StateBytesPerToken     float64
	StateBytesFixed        float64
	LastLayerBytesPerToken float64
	LastLayerBytesFixed    float64
}

// Load is the moment's queue state.
type Load struct {
	// PrefillUp is false when no prefill worker is registered.
	PrefillUp bool
	// PassRunning and PassRemaining describe the weight pass in progress: a
	// new job joins the next pass, which starts when this one ends.
	PassRunning   bool
	PassRemaining time.Duration
	// NextPassTokens are the tokens already waiting for the next pass, which
	// the new job would share.
	NextPassTokens int
	// LocalQueue is the prompt tokens left to prefill of each job already
	// admitted to the decode group.
	LocalQueue []int
	// LocalChunk is the group's prefill step in prompt rows: the group
	// serves its queued prompts in turn, one chunk each, so a new prompt
	// waits for at most as many tokens of each earlier one as it has
	// itself. 0 means whole prompts in arrival order.
	LocalChunk int
	// Threshold is the prompt length above which the Threshold policy
	// goes remote.
	Threshold int
}

// Prediction is a predicted time to first token, with where it goes.
type Prediction struct {
	Total time.Duration
	// Remote: QueueWait (until the pass starts), Pass (the weight pass that
	// carries the prompt), TransferTail (state still in flight after the
	// pass). Local: QueueWait, Prefill. Both: FirstStep.
	QueueWait, Pass, Prefill, TransferTail, FirstStep time.Duration
}

// Decision is the router's answer for one job.
type Decision struct {
	Policy Policy
	Target Target
	Local  Prediction
	Remote Prediction // zero when no prefill worker is up
	Reason string
}

// PredictRemote is the remote TTFT: wait for the running pass, then a pass
// that takes max(floor, tokens/rate) for every prompt sharing it, plus the
// state still in flight when it ends, plus the first decode step on the
// group. prompt is the job's prompt length; the prefill worker runs
// prompt-1 tokens.
func PredictRemote(r Rates, s Shape, l Load, prompt int) Prediction {
	var p Prediction
	if l.PassRunning {
		p.QueueWait = l.PassRemaining
	}
	tokens := float64(max(prompt-1, 0))
	compute := secs((tokens + float64(l.NextPassTokens)) / positive(r.PrefillTokPerS))
	p.Pass = max(r.PassFloor, compute)
	// Layers stream out while later ones compute; what cannot keep up with
	// the pass, and the last layer itself, is left after it.
	total := secs((s.StateBytesFixed + s.StateBytesPerToken*tokens) / positive(r.LinkBytesPerS))
	last := secs((s.LastLayerBytesFixed + s.LastLayerBytesPerToken*tokens) / positive(r.LinkBytesPerS))
	p.TransferTail = max(last, total-p.Pass) + r.LinkRTT
	p.FirstStep = r.DecodeStep
	p.Total = p.QueueWait + p.Pass + p.TransferTail + p.FirstStep
	return p
}

// PredictLocal is the local TTFT: the share of the group's backlog served
// before the prompt's last chunk, then the prompt at the group's prefill
// rate (prompt-1 tokens prefilled, the last one is the first decode step).
func PredictLocal(r Rates, l Load, prompt int) Prediction {
	var p Prediction
	tokens := max(prompt-1, 0)
	p.QueueWait = secs(float64(LocalAhead(l.LocalQueue, l.LocalChunk, tokens)) / positive(r.LocalPrefillTokPerS))
	p.Prefill = secs(float64(tokens) / positive(r.LocalPrefillTokPerS))
	p.FirstStep = r.DecodeStep
	p.Total = p.QueueWait + p.Prefill + p.FirstStep
	return p
}

// LocalAhead is how many prompt tokens of the queued prefills the group
// runs before a new prompt of the given tokens is done. Served in turn a
// chunk at a time, the new prompt needs ceil(tokens/chunk) turns, and each
// queued prompt gets as many turns before it, or fewer if it ends first.
// A prompt with nothing to prefill goes straight to decoding, which
// alternates with prefill steps: it waits for at most one step. chunk <= 0
// is arrival order: the whole queue goes first.
func LocalAhead(queue []int, chunk, tokens int) int {
	ahead := 0
	for _, q := range queue {
		if chunk > 0 && tokens > 0 {
			q = min(q, (tokens+chunk-1)/chunk*chunk)
		}
		ahead += max(q, 0)
	}
	if chunk > 0 && tokens <= 0 {
		ahead = min(ahead, chunk)
	}
	return ahead
}

// Route decides where a prompt of the given length is prefilled.
func Route(policy Policy, r Rates, s Shape, l Load, prompt int) Decision {
	d := Decision{Policy: policy, Local: PredictLocal(r, l, prompt)}
	if l.PrefillUp {
		d.Remote = PredictRemote(r, s, l, prompt)
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
func BreakEven(r Rates, s Shape, maxPrompt int) int {
	idle := Load{PrefillUp: true}
	better := func(n int) bool { return PredictRemote(r, s, idle, n).Total < PredictLocal(r, idle, n).Total }
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

// Unknown is the prediction for work at a rate nobody has measured (a
// zero rate): later than any real prediction, and sums of a few of them
// do not overflow.
const Unknown = time.Duration(math.MaxInt64 / 4)

// Seconds prints a prediction in seconds, or "unknown" for one that rests
// on an unmeasured rate.
func Seconds(d time.Duration) string {
	if d >= Unknown {
		return "unknown"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func secs(s float64) time.Duration {
	if math.IsInf(s, 0) || s > 1e9 {
		return Unknown
	}
	return time.Duration(s * float64(time.Second))
}

func positive(v float64) float64 {
	if v > 0 {
		return v
	}
	return math.SmallestNonzeroFloat64
}
