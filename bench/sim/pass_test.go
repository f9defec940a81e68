package sim

import (
	"testing"
	"time"
)

func secs(v ...float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, s := range v {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out
}

func TestPassWithoutPrefetchAddsReadsAndCompute(t *testing.T) {
	var link LinkState
	p := TimePass(PassInput{Read: secs(2, 2, 2), Compute: secs(1, 1, 1), Depth: 0}, &link)
	if p.End != 9*time.Second {
		t.Fatalf("depth 0: pass ends at %v, want 9s (every read waits for the previous compute)", p.End)
	}
	if p.ReadWait != 6*time.Second || p.Read != 6*time.Second || p.Compute != 3*time.Second {
		t.Fatalf("read wait %v, read %v, compute %v; want 6s, 6s, 3s", p.ReadWait, p.Read, p.Compute)
	}
}

func TestPrefetchHidesTheSmallerOfReadAndCompute(t *testing.T) {
	var link LinkState
	// Read-bound: every read back to back, then the last layer's compute.
	p := TimePass(PassInput{Read: secs(2, 2, 2), Compute: secs(1, 1, 1), Depth: 1}, &link)
	if p.End != 7*time.Second || p.ReadWait != 4*time.Second {
		t.Fatalf("read-bound: end %v, read wait %v; want 7s, 4s", p.End, p.ReadWait)
	}
	// Compute-bound: the first read, then compute back to back.
	p = TimePass(PassInput{Read: secs(1, 1, 1), Compute: secs(3, 3, 3), Depth: 1}, &link)
	if p.End != 10*time.Second || p.ReadWait != time.Second {
		t.Fatalf("compute-bound: end %v, read wait %v; want 10s, 1s", p.End, p.ReadWait)
	}
	// The ring bounds the read-ahead: with depth 1 the third read waits for
	// the first layer's compute to free its slot.
	if p.ReadEnd[2] != 5*time.Second {
		t.Fatalf("third read ends at %v, want 5s (slot free at 4s)", p.ReadEnd[2])
	}
	p = TimePass(PassInput{Read: secs(1, 1, 1), Compute: secs(3, 3, 3), Depth: 2}, &link)
	if p.ReadEnd[2] != 3*time.Second {
		t.Fatalf("depth 2: third read ends at %v, want 3s", p.ReadEnd[2])
	}
}

func TestStatesStreamDuringThePassAndOnlyTheTailIsLeft(t *testing.T) {
	link := LinkState{BytesPerS: 10, RTT: 100 * time.Millisecond}
	p := TimePass(PassInput{Start: time.Second, Read: secs(0, 0, 0), Compute: secs(2, 2, 2), Depth: 2, SinkQueue: 4,
		Emit: [][]int64{{10, 10, 10}, nil}}, &link)
	// Layers end at 3, 5, 7 s; each state takes 1 s on the link.
	if p.End != 7*time.Second {
		t.Fatalf("end %v, want 7s", p.End)
	}
	if p.FirstSend[0] != 3*time.Second || p.Delivered[0] != 8*time.Second+100*time.Millisecond {
		t.Fatalf("first send %v, delivered %v; want 3s and 8.1s (last layer + RTT)", p.FirstSend[0], p.Delivered[0])
	}
	if p.Bytes[0] != 30 || p.Bytes[1] != 0 || p.Delivered[1] != 0 {
		t.Fatalf("bytes %v, delivered %v: a non-final piece emits nothing", p.Bytes, p.Delivered)
	}
	if link.Bytes != 30 || link.Busy != 3*time.Second || link.Free != 8*time.Second {
		t.Fatalf("link %+v", link)
	}
	// The link is shared: a pass starting while it is busy queues behind.
	q := TimePass(PassInput{Start: 7 * time.Second, Read: secs(0), Compute: secs(0.5), Emit: [][]int64{{5}}}, &link)
	if q.FirstSend[0] != 8*time.Second || q.Delivered[0] != 8*time.Second+600*time.Millisecond {
		t.Fatalf("second pass: first send %v, delivered %v; want 8s, 8.6s", q.FirstSend[0], q.Delivered[0])
	}
}

func TestASlowLinkSlowsThePassThroughTheSinkQueue(t *testing.T) {
	link := LinkState{BytesPerS: 10}
	// Queue of 1: at most two layers outstanding (one queued, one sending).
	p := TimePass(PassInput{Read: secs(0, 0, 0, 0), Compute: secs(1, 1, 1, 1), Depth: 2, SinkQueue: 1,
		Emit: [][]int64{{50, 50, 50, 50}}}, &link)
	// Sends: 1-6, 6-11, 11-16, 16-21. Layer 2's put waits for layer 0's send
	// (6 s), layer 3's for layer 1's (11 s).
	if p.End != 11*time.Second || p.SinkWait != 7*time.Second {
		t.Fatalf("end %v, sink wait %v; want 11s, 7s", p.End, p.SinkWait)
	}
	if p.Delivered[0] != 21*time.Second {
		t.Fatalf("delivered %v, want 21s", p.Delivered[0])
	}
}

func TestPerRankLinksSendTheirLayersAtOnce(t *testing.T) {
	if got := rankLanes(9, 2); len(got) != 9 || got[4] != 0 || got[5] != 1 {
		t.Fatalf("lanes %v: want layers 0-4 on rank 0 and 5-8 on rank 1, as the decode group splits them", got)
	}
	// Four layers done at once, 10 bytes each at 10 B/s: one shared link
	// sends them one after the other (4 s); a link per rank, two at a time.
	shared := LinkState{BytesPerS: 10}
	p := TimePass(PassInput{Read: secs(0, 0, 0, 0), Compute: secs(0, 0, 0, 0), Depth: 2, SinkQueue: 4, Emit: [][]int64{{10, 10, 10, 10}}}, &shared)
	lanes := LinkState{BytesPerS: 10, Lane: rankLanes(4, 2)}
	q := TimePass(PassInput{Read: secs(0, 0, 0, 0), Compute: secs(0, 0, 0, 0), Depth: 2, SinkQueue: 4, Emit: [][]int64{{10, 10, 10, 10}}}, &lanes)
	if p.Delivered[0] != 4*time.Second || q.Delivered[0] != 2*time.Second || lanes.Bytes != 40 || lanes.Busy != 4*time.Second {
		t.Fatalf("delivered %v on a shared link, %v on a link per rank (%+v); want 4s and 2s", p.Delivered[0], q.Delivered[0], lanes)
	}
}
