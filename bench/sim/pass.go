package sim

import (
	"slices"
	"time"
)

// LinkState is the data plane from the prefill box to the decode group: one
// FIFO of bytes at a fixed rate (the box's network interface is shared by
// every rank's connections), or with Lane one such FIFO per decode rank,
// plus a round trip for each job's commit.
type LinkState struct {
	BytesPerS float64
	RTT       time.Duration
	// Lane, if set, is the decode rank of each layer: each rank has a link
	// of its own at BytesPerS, and a layer's state takes its rank's.
	Lane []int
	// Free is when the shared link has sent everything handed to it so
	// far; free the same per lane.
	Free time.Duration
	free []time.Duration
	// Busy and Bytes total the sends.
	Busy  time.Duration
	Bytes int64
}

// Send hands bytes to the shared link at time ready and returns when they
// start and finish going out.
func (l *LinkState) Send(ready time.Duration, bytes int64) (start, end time.Duration) {
	start = max(ready, l.Free)
	d := seconds(float64(bytes) / l.BytesPerS)
	l.Free = start + d
	l.Busy += d
	l.Bytes += bytes
	return start, l.Free
}

// SendLayer hands layer L's bytes to its rank's link (the shared link
// without lanes).
func (l *LinkState) SendLayer(L int, ready time.Duration, bytes int64) (start, end time.Duration) {
	if l.Lane == nil {
		return l.Send(ready, bytes)
	}
	k := l.Lane[L]
	for len(l.free) <= k {
		l.free = append(l.free, 0)
	}
	start = max(ready, l.free[k])
	d := seconds(float64(bytes) / l.BytesPerS)
	l.free[k] = start + d
	l.Busy += d
	l.Bytes += bytes
	return start, l.free[k]
}

// rankLanes gives consecutive runs of layers to ranks, as even as possible
// with the extra layers on the first ranks (decode-worker/rank.Split's
// rule), and returns each layer's rank.
func rankLanes(layers, ranks int) []int {
	ranks = max(1, min(ranks, layers))
	out := make([]int, 0, layers)
	for r := range ranks {
		k := layers / ranks
		if r < layers%ranks {
			k++
		}
		for range k {
			out = append(out, r)
		}
	}
	return out
}

// PassInput is one weight pass: per layer, how long its read and its
// compute over every piece of the pass take, the prefetch depth, and what
// each job of the pass emits.
type PassInput struct {
	Start         time.Duration
	Read, Compute []time.Duration
	// Depth is the planner's prefetch depth: the ring has Depth+1 slots and
	// a layer's slot is free again when its compute ends.
	Depth int
	// SinkQueue is each job's queue of layer states in front of the link
	// (the scheduler's SinkQueue); a put waits while the queue and the
	// layer being sent are full, so a slow link slows the pass.
	SinkQueue int
	// Emit[j][L] is job j's state bytes of layer L; nil for a job whose
	// piece does not end its prompt (its state goes out in a later pass).
	Emit [][]int64
}

// PassTiming is when everything of a pass happened.
type PassTiming struct {
	Start, End                        time.Duration
	ReadEnd, ComputeStart, ComputeEnd []time.Duration
	// Read and Compute sum the layers' read and compute times; ReadWait is
	// how long compute stood waiting for weights, SinkWait how long it
	// stood waiting for room in a sink queue (link backpressure).
	Read, Compute, ReadWait, SinkWait time.Duration
	// Per job: when its first layer started on the link, when its last
	// byte and then its commit acknowledgement arrived (Delivered), and its
	// bytes. Zero for jobs that emitted nothing.
	FirstSend, Delivered []time.Duration
	Bytes                []int64
}

// TimePass computes a pass layer by layer. Reads run ahead of compute as far
// as the ring allows; compute of layer L starts when its weights are in and
// layer L-1's states are handed over; each layer's states go on the link as
// soon as the layer is done, so only what the link cannot keep up with,
// and the last layer, is left after the pass.
func TimePass(in PassInput, link *LinkState) PassTiming {
	n := len(in.Read)
	t := PassTiming{Start: in.Start,
		ReadEnd: make([]time.Duration, n), ComputeStart: make([]time.Duration, n), ComputeEnd: make([]time.Duration, n),
		FirstSend: make([]time.Duration, len(in.Emit)), Delivered: make([]time.Duration, len(in.Emit)), Bytes: make([]int64, len(in.Emit))}
	q := max(in.SinkQueue, 1)
	sent := make([][]time.Duration, len(in.Emit)) // send ends per job and layer
	for j, e := range in.Emit {
		if e != nil {
			sent[j] = make([]time.Duration, n)
		}
	}
	readFree, handed := in.Start, in.Start // reader free; previous layer handed over
	for L := 0; L < n; L++ {
		start := readFree
		if k := L - in.Depth - 1; k >= 0 {
			start = max(start, t.ComputeEnd[k]) // wait for a ring slot
		}
		t.ReadEnd[L] = start + in.Read[L]
		readFree = t.ReadEnd[L]
		t.Read += in.Read[L]

		cs := max(t.ReadEnd[L], handed)
		t.ReadWait += cs - handed
		t.ComputeStart[L] = cs
		t.ComputeEnd[L] = cs + in.Compute[L]
		t.Compute += in.Compute[L]

		done := t.ComputeEnd[L]
		for j, e := range in.Emit {
			if e == nil {
				continue
			}
			if k := L - q - 1; k >= 0 {
				done = max(done, sent[j][k]) // the queue and the send in progress are full
			}
			s, end := link.SendLayer(L, t.ComputeEnd[L], e[L])
			if L == 0 {
				t.FirstSend[j] = s
			}
			sent[j][L] = end
			t.Bytes[j] += e[L]
		}
		t.SinkWait += done - t.ComputeEnd[L]
		handed = done
	}
	t.End = handed
	for j := range in.Emit {
		if sent[j] != nil && n > 0 {
			t.Delivered[j] = slices.Max(sent[j]) + link.RTT // the last layer is last only on a shared link
		}
	}
	return t
}
