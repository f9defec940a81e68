package costmodel

import (
	"math"
	"time"
)

// Rates are the cost model's measured inputs.
type Rates struct {
	// PassFloor is the time one weight pass takes with no compute to hide:
	// reading every layer's weights (a read-only pass, or the weights'
	// bytes over the measured read rate; never the read wall time of a
	// pass that compute held back).
	PassFloor time.Duration
	// Prefill is the prefill worker's compute per term inside its passes;
	// Local the decode group's own prefill, chunk by chunk.
	Prefill, Local Compute
	// LinkBytesPerS and LinkRTT describe the data plane between the boxes.
	LinkBytesPerS float64
	LinkRTT       time.Duration
	// PrefillVision and LocalVision are the vision tower's rates on each
	// path in GFLOP/s over Vision.Work (0: the path's dense rate stands
	// in). PrefillVisionSerial and LocalVisionSerial say the path runs the
	// tower in its own loop (a device backend), so the queue in front does
	// not move while it runs.
	PrefillVision, LocalVision             float64
	PrefillVisionSerial, LocalVisionSerial bool
	// DecodeStep is one decode step of the group (the first token after
	// either prefill is one step).
	DecodeStep time.Duration
	// LocalOverhead and RemoteOverhead are the control plane's own latency
	// on each path, measured on finished jobs (what their time to first
	// token spent beyond the parts priced above: submission, routing and
	// admission; for a remote job also the assignment to the prefill
	// worker, and the ranks' readiness around the ring after the commit).
	LocalOverhead, RemoteOverhead time.Duration
}

// Load is the moment's queue state in front of a new job.
type Load struct {
	// PrefillUp is false when no prefill worker is registered.
	PrefillUp bool
	// PassRunning and PassRemaining describe the weight pass in progress: a
	// new job joins the next pass, which starts when this one ends.
	PassRunning   bool
	PassRemaining time.Duration
	// NextPass are the tokens to prefill of each job already waiting for
	// the next pass, which the new job would share.
	NextPass []int
	// LocalQueue is the prompt tokens left to prefill of each job already
	// admitted to the decode group.
	LocalQueue []int
	// LocalChunk is the group's prefill step in prompt rows: the group
	// serves its queued prompts in turn, one chunk each, so a new prompt
	// waits for at most as many tokens of each earlier one as it has
	// itself. 0 means whole prompts in arrival order.
	LocalChunk int
	// LocalStages are the group's ranks in ring order, each with the
	// layers it runs: the ranks pipeline a prompt's chunks. None, or ranges
	// that do not cover the layers once in order: the chunks one after the
	// other.
	LocalStages []Stage
	// LocalStops are positions of the new prompt, in order, where the
	// group ends a prefill step besides its chunk limit: where its prefix
	// cache keeps the state (prefixkey.Snapshots). A short prompt cut there
	// runs as two steps that the ranks overlap.
	LocalStops []int
	// LocalCached is how many of the new prompt's first tokens the decode
	// group holds in its prefix cache; it prefills only the rest, attending
	// to the cached rows.
	LocalCached int
	// RemoteSplit, RemoteCached and RemoteAppend describe the remote path
	// with the prefix caches. RemoteSplit, when > 0, is where the prefill
	// worker's part of the prompt ends, the last multiple of 64 before the
	// last token, so that both sides keep the state; the group prefills the
	// rest itself once the state is in. RemoteCached is how many of the
	// first tokens the prefill worker's store holds, so that its pass
	// computes only the rest of its part. RemoteAppend is how many the group
	// holds rows of, so that the transfer carries only the rows after them.
	RemoteSplit, RemoteCached, RemoteAppend int
	// RemoteCopies is how many ranks each MLA row is sent to: every tensor
	// rank of a stage holds the stage's latent rows whole, while the KDA
	// states are split between them (0 or 1: one rank per stage).
	RemoteCopies int
	// Images are the new prompt's images: the path that prefills an image
	// (past its cached prefix) first runs the vision tower over them.
	Images []Image
	// Threshold is the prompt length above which the router's Threshold
	// policy goes remote; it is not a cost.
	Threshold int
}

// Prediction is a predicted time to first token and its parts.
type Prediction struct {
	Total time.Duration
	// A remote prediction has QueueWait until the pass starts, Pass for the
	// weight pass that carries the prompt and TransferTail for the state
	// still in flight after the pass; a local one has QueueWait and
	// Prefill. Both have FirstStep and Overhead, the control plane's own
	// latency on the path, and Vision, the tower's run over the prompt's
	// images before it joins a pass or the group's chunks (the queue in
	// front moves meanwhile: QueueWait is what is left of it after).
	QueueWait, Pass, Prefill, TransferTail, FirstStep, Overhead, Vision time.Duration
}

// PredictRemote is the remote TTFT of a prompt of prompt tokens, whose
// prefill worker runs all but the last token, or its part up to
// RemoteSplit. It is the wait for the running pass, then a pass that takes
// the longer of the floor and the compute of every prompt sharing it, plus
// the state still in flight when that pass ends past the rows the group
// holds, plus the group's own prefill of the rest of the prompt and the
// first decode step on the group. Compute prices each term at its rate,
// the attention over each prompt's own cache and a fixed cost per layer,
// from a prompt's stored prefix on. A part the store holds whole runs no
// pass.
func PredictRemote(m *Model, r Rates, l Load, prompt int) Prediction {
	var p Prediction
	if l.PassRunning {
		p.QueueWait = l.PassRemaining
	}
	end := max(prompt-1, 0)
	tokens := end
	if l.RemoteSplit > 0 {
		tokens = min(l.RemoteSplit, end)
	}
	from := min(max(l.RemoteCached, 0), tokens)
	p.Vision = visionTime(m, r.PrefillVision, r.Prefill, l.Images, from)
	if !r.PrefillVisionSerial {
		p.QueueWait = max(p.QueueWait-p.Vision, 0)
	}
	work := m.Work(from, tokens)
	for _, q := range l.NextPass {
		work = work.Add(m.Work(0, q))
	}
	if from < tokens || len(l.NextPass) > 0 {
		p.Pass = max(r.PassFloor, r.Prefill.Time(work, m.Layers))
	}
	// Layers stream out while later ones compute; what cannot keep up with
	// the pass, and the last layer itself, is left after it. Rows the
	// group holds are not sent; the rows sent go to each tensor rank.
	rows := (tokens - min(max(l.RemoteAppend, 0), tokens)) * max(l.RemoteCopies, 1)
	total := secs(m.Shape.StateBytes(rows) / positive(r.LinkBytesPerS))
	last := secs(m.Shape.LastLayerBytes(rows) / positive(r.LinkBytesPerS))
	p.TransferTail = max(last, total-p.Pass) + r.LinkRTT
	if end > tokens {
		p.Prefill = r.Local.Time(m.Work(tokens, end), m.Layers)
	}
	p.FirstStep = r.DecodeStep
	p.Overhead = r.RemoteOverhead
	p.Total = sum(p.QueueWait, p.Vision, p.Pass, p.TransferTail, p.Prefill, p.FirstStep, p.Overhead)
	return p
}

// PredictLocal is the local TTFT: the share of the group's backlog served
// before the prompt's last chunk, then the prompt chunk by chunk at the
// group's rates (all but the last token prefilled, the last one is the
// first decode step).
func PredictLocal(m *Model, r Rates, l Load, prompt int) Prediction {
	var p Prediction
	tokens := max(prompt-1, 0)
	from := min(max(l.LocalCached, 0), tokens) // a cached prefix is not prefilled again
	var ahead FLOPs
	for _, s := range aheadShares(l.LocalQueue, l.LocalChunk, tokens-from) {
		ahead = ahead.Add(m.Work(0, s))
	}
	// Queued chunks share the group's steps with this prompt's: their
	// fixed costs are this prompt's own.
	p.QueueWait = r.Local.Time(ahead, 0)
	p.Vision = visionTime(m, r.LocalVision, r.Local, l.Images, from)
	if p.QueueWait < Unknown && !r.LocalVisionSerial {
		p.QueueWait = max(p.QueueWait-p.Vision, 0)
	}
	p.Prefill = localPrefill(m, r.Local, l, from, tokens)
	p.FirstStep = r.DecodeStep
	p.Overhead = r.LocalOverhead
	p.Total = sum(p.QueueWait, p.Vision, p.Prefill, p.FirstStep, p.Overhead)
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
	n := 0
	for _, s := range aheadShares(queue, chunk, tokens) {
		n += s
	}
	return n
}

// aheadShares is LocalAhead per queued prompt.
func aheadShares(queue []int, chunk, tokens int) []int {
	out := make([]int, 0, len(queue))
	for _, q := range queue {
		if chunk > 0 && tokens > 0 {
			q = min(q, (tokens+chunk-1)/chunk*chunk)
		}
		out = append(out, max(q, 0))
	}
	if chunk > 0 && tokens <= 0 {
		left := chunk // one step in flight
		for i, s := range out {
			out[i] = min(s, left)
			left -= out[i]
		}
	}
	return out
}

// Unknown is the prediction for work at a rate nobody has measured (a
// zero rate): later than any real prediction, and sums of a few of them
// do not overflow.
const Unknown = time.Duration(math.MaxInt64 / 4)

// Stage is one pipeline stage: a rank and the layers [First, End) it runs.
type Stage struct{ First, End int }

// localPrefill is the group's prefill of positions [from, to) in the steps
// LocalSteps plans. Its ranks overlap a prompt's steps: a rank starts step
// k once it has passed step k-1 on and the rank before it has finished
// step k, so a long prompt takes about its steps' time on the slowest
// rank, not the sum over the ranks (the fitted rates are compute time
// summed over the ranks, which is what a flow through one stage would
// take).
func localPrefill(m *Model, c Compute, l Load, from, to int) time.Duration {
	steps := LocalSteps(from, to, l.LocalChunk, l.LocalStops)
	if len(steps) == 0 {
		return 0
	}
	stages := l.LocalStages
	if !coversLayers(stages, m.Layers) {
		stages = []Stage{{0, m.Layers}}
	}
	done := make([]time.Duration, len(stages)) // each stage's end of the latest step
	for _, st := range steps {
		var prev time.Duration // the stage before's end of this step
		for i, s := range stages {
			t := c.Time(m.StageWork(s.First, s.End, st.Lo, st.Hi), s.End-s.First)
			if done[i] = sum(max(done[i], prev), t); done[i] >= Unknown {
				return Unknown
			}
			prev = done[i]
		}
	}
	return done[len(done)-1]
}

// Span is the positions [Lo, Hi) of one prefill step.
type Span struct{ Lo, Hi int }

// LocalSteps are the prefill steps a decode group runs a prompt's
// positions [from, to) in when it has it alone: each ends at the first of
// the prompt's end, the next of stops after its start, and chunk rows on
// (chunk <= 0: no limit). chunk is a multiple of the KDA chunk, and from
// and the stops lie on its grid (the group's rules), so every step but
// the last starts on it.
func LocalSteps(from, to, chunk int, stops []int) []Span {
	var out []Span
	next := 0 // the first stop not behind lo: stops are in order
	for lo := from; lo < to; {
		hi := to
		if chunk > 0 {
			hi = min(hi, lo+chunk)
		}
		for next < len(stops) && stops[next] <= lo {
			next++
		}
		if next < len(stops) {
			hi = min(hi, stops[next])
		}
		out = append(out, Span{lo, hi})
		lo = hi
	}
	return out
}

// coversLayers reports whether stages run layers [0, layers) once, in order.
func coversLayers(stages []Stage, layers int) bool {
	next := 0
	for _, s := range stages {
		if s.First != next || s.End <= s.First {
			return false
		}
		next = s.End
	}
	return len(stages) > 0 && next == layers
}

// sum adds durations, saturating at Unknown.
func sum(ds ...time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		if d >= Unknown || t+d >= Unknown {
			return Unknown
		}
		t += d
	}
	return t
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
