package router

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/internal/modelconfig"
)

// k3 is the full K3 model (BF16 latent rows): 24 MLA, 69 KDA layers.
var k3 = func() *costmodel.Model {
	b, err := configs.ModelPreset("k3")
	if err != nil {
		panic(err)
	}
	c, err := modelconfig.Parse(b)
	if err != nil {
		panic(err)
	}
	return costmodel.New(c, 2)
}()

// rtx5090 seeds from the published figures (docs/HARDWARE.md): a 28 s pass
// floor, ~800 tok/s prefill at 8k tokens, 10 GbE, 4 Macs prefilling at ~75
// tok/s at 8k tokens (equal rates per term: only tokens/s are published).
var rtx5090 = Rates{
	PassFloor: 28 * time.Second, Prefill: k3.Seed(800, 8192), Local: k3.Seed(75, 8192),
	LinkBytesPerS: 1.15e9, LinkRTT: 300 * time.Microsecond, DecodeStep: 50 * time.Millisecond,
}

var (
	PredictRemote = costmodel.PredictRemote
	PredictLocal  = costmodel.PredictLocal
	LocalAhead    = costmodel.LocalAhead
)

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func TestShortPromptsStayLocalLongGoRemote(t *testing.T) {
	idle := Load{PrefillUp: true}
	if d := Route(Auto, k3, rtx5090, idle, 500); d.Target != TargetLocal {
		t.Fatalf("500 tokens went %s (%s)", d.Target, d.Reason)
	}
	if d := Route(Auto, k3, rtx5090, idle, 300000); d.Target != TargetRemote {
		t.Fatalf("300k tokens went %s (%s)", d.Target, d.Reason)
	}
	// The pass floor dominates below ~22k tokens (28 s x 800 tok/s).
	p := PredictRemote(k3, rtx5090, idle, 10000)
	if p.Pass != rtx5090.PassFloor {
		t.Fatalf("10k-token pass %v, want the floor %v", p.Pass, rtx5090.PassFloor)
	}
}

func TestBreakEvenNearAnchors(t *testing.T) {
	// docs/HARDWARE.md: break-even at roughly 1.5k-5k uncached tokens.
	n := BreakEven(k3, rtx5090, 1<<20)
	if n < 1500 || n > 5000 {
		t.Fatalf("break-even %d tokens, want 1.5k-5k", n)
	}
	local := PredictLocal(k3, rtx5090, Load{}, n)
	remote := PredictRemote(k3, rtx5090, Load{PrefillUp: true}, n)
	if remote.Total >= local.Total {
		t.Fatalf("at break-even remote %v is not below local %v", remote.Total, local.Total)
	}
}

func TestQueueingShiftsTheDecision(t *testing.T) {
	// A long pass in progress makes a mid-size prompt cheaper locally.
	busy := Load{PrefillUp: true, PassRunning: true, PassRemaining: 25 * time.Second}
	idle := Load{PrefillUp: true}
	if d := Route(Auto, k3, rtx5090, idle, 3000); d.Target != TargetRemote {
		t.Fatalf("idle: 3000 tokens went %s", d.Target)
	}
	if d := Route(Auto, k3, rtx5090, busy, 3000); d.Target != TargetLocal {
		t.Fatalf("busy pass: 3000 tokens went %s (%s)", d.Target, d.Reason)
	}
	// Sharing a pass: tokens already waiting lengthen it only past the floor.
	shared := Load{PrefillUp: true, NextPass: []int{100000}}
	if p := PredictRemote(k3, rtx5090, shared, 1000); p.Pass <= rtx5090.PassFloor {
		t.Fatalf("a pass carrying 101k tokens should exceed the floor, is %v", p.Pass)
	}
}

func TestTransferTailIsTheLastLayerWhenTheLinkKeepsUp(t *testing.T) {
	p := PredictRemote(k3, rtx5090, Load{PrefillUp: true}, 300000)
	last := time.Duration(1152 * 299999 / rtx5090.LinkBytesPerS * float64(time.Second))
	if p.TransferTail > last+time.Millisecond {
		t.Fatalf("tail %v, want about the last layer's %v", p.TransferTail, last)
	}
	// A link too slow to keep up with the pass (8.3 GB at 10 MB/s, 830 s,
	// against a ~700 s pass): the backlog shows in the tail.
	slow := rtx5090
	slow.LinkBytesPerS = 10e6
	q := PredictRemote(k3, slow, Load{PrefillUp: true}, 300000)
	backlog := secs(k3.Shape.StateBytes(299999)/10e6) - q.Pass + slow.LinkRTT
	if q.TransferTail < 60*time.Second || q.TransferTail != backlog {
		t.Fatalf("10 MB/s link: tail %v, want the unhidden backlog %v", q.TransferTail, backlog)
	}
}

func TestPoliciesAndNoPrefillWorker(t *testing.T) {
	l := Load{PrefillUp: true, Threshold: 1000}
	if d := Route(Local, k3, rtx5090, l, 300000); d.Target != TargetLocal {
		t.Fatal("policy local ignored")
	}
	if d := Route(Remote, k3, rtx5090, l, 10); d.Target != TargetRemote {
		t.Fatal("policy remote ignored")
	}
	if d := Route(Threshold, k3, rtx5090, l, 1001); d.Target != TargetRemote {
		t.Fatal("threshold rule ignored")
	}
	if d := Route(Remote, k3, rtx5090, Load{}, 300000); d.Target != TargetLocal || d.Remote.Total != 0 {
		t.Fatalf("no prefill worker: went %s", d.Target)
	}
}

func TestEstimatorMovesTowardMeasurements(t *testing.T) {
	e := NewEstimator(rtx5090, 0.5)
	e.ObserveFloor(20 * time.Second)
	r := e.Rates()
	if r.PassFloor != 24*time.Second || r.Prefill != rtx5090.Prefill || r.Local != rtx5090.Local {
		t.Fatalf("floor %v, want 24s; compute %v, %v, want the seeds", r.PassFloor, r.Prefill, r.Local)
	}
	// A measured pass: the prefill terms are fitted to it (one sample:
	// the seed's terms scaled to explain it).
	w := k3.Work(0, 20000)
	e.ObservePrefill(costmodel.Sample{Work: w, Calls: k3.Layers, Took: 10 * time.Second})
	if got := e.Rates().Prefill.Time(w, k3.Layers); got < 10*time.Second-time.Millisecond || got > 10*time.Second+time.Millisecond {
		t.Fatalf("fitted prefill prices the measured pass at %v, want 10s", got)
	}
	e.ObserveLocal(costmodel.Sample{Work: w, Calls: 1}) // no time: ignored
	e.ObserveTransfer(2e9, time.Second)
	e.ObserveDecodeStep(30 * time.Millisecond)
	r = e.Rates()
	if r.Local != rtx5090.Local || r.LinkBytesPerS != (1.15e9+2e9)/2 || r.DecodeStep != 40*time.Millisecond {
		t.Fatalf("rates %+v", r)
	}
}

func TestLocalAheadServesQueuedPromptsInTurn(t *testing.T) {
	queue := []int{100000, 300, 1500}
	for _, c := range []struct {
		chunk, tokens, want int
	}{
		{0, 200, 101800},               // arrival order: everything first
		{512, 200, 512 + 300 + 512},    // one turn: a chunk of each, the short one whole
		{512, 1000, 1024 + 300 + 1024}, // two turns
		{512, 5000, 5120 + 300 + 1500}, // ten turns: the short ones end first
		{512, 0, 512},                  // nothing to prefill: it decodes after the step in flight
	} {
		if got := LocalAhead(queue, c.chunk, c.tokens); got != c.want {
			t.Errorf("LocalAhead(%v, chunk %d, %d tokens) = %d, want %d", queue, c.chunk, c.tokens, got, c.want)
		}
	}
	if got := LocalAhead(nil, 512, 1000); got != 0 {
		t.Errorf("empty queue: %d tokens ahead, want 0", got)
	}
}

func TestShortPromptBehindLongLocalPrefillStaysLocal(t *testing.T) {
	// A 100k-token prompt is prefilling on the Macs (~22 min at 75 tok/s).
	// A 300-token prompt served in turn waits one 512-row chunk of it, so
	// it stays local; in arrival order it would wait the whole prefill and
	// be sent through a 28 s weight pass instead.
	busy := Load{PrefillUp: true, LocalQueue: []int{100000}, LocalChunk: 512}
	d := Route(Auto, k3, rtx5090, busy, 300)
	if d.Target != TargetLocal {
		t.Fatalf("300 tokens behind a long local prefill went %s (%s)", d.Target, d.Reason)
	}
	if want := rtx5090.Local.Time(k3.Work(0, 512), 0); d.Local.QueueWait != want {
		t.Fatalf("local queue wait %v, want one chunk of the long prompt, %v", d.Local.QueueWait, want)
	}
	busy.LocalChunk = 0
	if d := Route(Auto, k3, rtx5090, busy, 300); d.Target != TargetRemote {
		t.Fatalf("arrival order: 300 tokens behind a 22-minute prefill went %s (%s)", d.Target, d.Reason)
	}
}

// TestUnmeasuredRatesPrintAsUnknown: a prediction resting on a rate nobody
// has measured yet reads "unknown" in the decision's reason, not the
// placeholder's 2305843009.21s.
func TestUnmeasuredRatesPrintAsUnknown(t *testing.T) {
	unmeasured := rtx5090
	unmeasured.Prefill = costmodel.Compute{}
	d := Route(Auto, k3, unmeasured, Load{PrefillUp: true}, 300000)
	if d.Target != TargetLocal || d.Reason != fmt.Sprintf("local %.2fs <= remote unknown", d.Local.Total.Seconds()) {
		t.Fatalf("went %s: %q", d.Target, d.Reason)
	}
	unmeasured.Local = costmodel.Compute{}
	d = Route(Auto, k3, unmeasured, Load{PrefillUp: true}, 300000)
	if strings.Contains(d.Reason, "2305843009") || d.Reason != "local unknown <= remote unknown" {
		t.Fatalf("reason %q", d.Reason)
	}
	if Seconds(1500*time.Millisecond) != "1.50s" || Seconds(Unknown) != "unknown" || Seconds(2*Unknown) != "unknown" {
		t.Fatal("Seconds")
	}
}

// TestOverheadIsTheUnpricedRest: a finished job's control-plane latency is
// its time to first token less the measured pass and tail and the
// predicted queue wait and first step (remote), or less the group's
// measured prefill and the predicted queue wait (local); the estimator
// moves each path's toward it, and the predictions add it.
func TestOverheadIsTheUnpricedRest(t *testing.T) {
	ms := time.Millisecond
	if d, ok := Overhead(TargetRemote, 100*ms, 30*ms, 2000*ms, 1500*ms, 200*ms, 1500*ms); !ok || d != 170*ms {
		t.Fatalf("remote: %v %v, want 170ms", d, ok)
	}
	if d, ok := Overhead(TargetLocal, 50*ms, 30*ms, 900*ms, 0, 0, 800*ms); !ok || d != 50*ms {
		t.Fatalf("local: %v %v, want 50ms", d, ok)
	}
	if d, ok := Overhead(TargetLocal, 0, 0, 700*ms, 0, 0, 800*ms); !ok || d != 0 {
		t.Fatalf("a local job marked late: %v %v, want 0", d, ok)
	}
	for _, c := range [][3]time.Duration{{0, 1, 1}, {ms, 0, 0}} {
		if _, ok := Overhead(TargetRemote, 0, 0, c[0], c[1], 0, c[2]); ok {
			t.Fatalf("no first token or no pass measured: %v gave an overhead", c)
		}
	}
	if _, ok := Overhead("elsewhere", 0, 0, ms, ms, 0, ms); ok {
		t.Fatal("an unknown target gave an overhead")
	}
	e := NewEstimator(rtx5090, 0.5)
	e.ObserveOverhead(TargetRemote, 200*ms)
	e.ObserveOverhead(TargetRemote, 100*ms)
	e.ObserveOverhead(TargetLocal, 40*ms)
	e.ObserveOverhead(TargetLocal, -ms)
	r := e.Rates()
	if r.RemoteOverhead != 150*ms || r.LocalOverhead != 40*ms {
		t.Fatalf("overheads remote %v local %v, want 150ms and 40ms", r.RemoteOverhead, r.LocalOverhead)
	}
	idle := Load{PrefillUp: true}
	base := Route(Auto, k3, rtx5090, idle, 3000)
	with := Route(Auto, k3, r, idle, 3000)
	if with.Remote.Overhead != 150*ms || with.Remote.Total != base.Remote.Total+150*ms || with.Local.Total != base.Local.Total+40*ms {
		t.Fatalf("predictions with the overheads: remote %+v local %+v", with.Remote, with.Local)
	}
}
