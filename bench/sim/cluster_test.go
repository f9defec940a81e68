package sim

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/bench/workload"
	"github.com/tandem-inference/tandem/coordinator/router"
)

// tinySetup is the tiny preset on round-number hardware: every layer read
// takes 10 ms (plus nothing), compute is nearly free, the group prefills a
// flat 100 tok/s and steps in 50 ms, the link moves 10 MB/s.
func tinySetup(t *testing.T, budget string) Setup {
	t.Helper()
	m, err := LoadModel("tiny")
	if err != nil {
		t.Fatal(err)
	}
	rate := float64(m.Layers[0].ReadBytes) / 0.010 / 1e9 // GB/s giving 10 ms for layer 0
	pre := &PrefillBox{DiskReadGBps: rate, Compute: Compute{KDA: 1e9, MLA: 1e9, MoE: 1e9, Dense: 1e9}, MemoryBudget: budget, Threads: 1}
	dec := &DecodeGroup{Ranks: 2, PrefillRate: []RatePoint{{Tokens: 1000, TokPerS: 100}}, PrefillChunk: 512, DecodeStepMS: 50, MaxBatch: 8}
	s := Setup{Name: "tiny", Model: m, Prefill: pre, Decode: dec, Link: &Link{GBps: 1e-2, RTTUS: 1000}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}

func run(t *testing.T, s Setup, jobs []workload.Job, p router.Policy) *Result {
	t.Helper()
	r, err := Run(context.Background(), s, jobs, Options{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func near(a, b, tol time.Duration) bool { return a-b <= tol && b-a <= tol }

func TestLocalJobIsChunkedPrefillThenAStep(t *testing.T) {
	s := tinySetup(t, "1GiB")
	r := run(t, s, []workload.Job{{ID: "a", Prompt: 1001, Output: 5}}, router.Local)
	j := r.Jobs[0]
	// 1000 tokens at 100 tok/s (chunks of 512 and 488), then one 50 ms step.
	if j.Target != router.TargetLocal || j.Prefill != 10*time.Second || j.FirstStep != 50*time.Millisecond || j.TTFT != 10050*time.Millisecond {
		t.Fatalf("local job: %+v", j)
	}
	// Four more tokens, one step each.
	if j.Done-j.FirstToken != 200*time.Millisecond || j.Bytes != 0 {
		t.Fatalf("decode took %v, moved %d bytes", j.Done-j.FirstToken, j.Bytes)
	}
}

func TestRemoteJobIsAPassThenTheTailThenAStep(t *testing.T) {
	s := tinySetup(t, "1GiB")
	r := run(t, s, []workload.Job{{ID: "a", Prompt: 101, Output: 1}}, router.Remote)
	j := r.Jobs[0]
	floor := PassFloor(s)
	if !near(floor, 90*time.Millisecond, 3*time.Millisecond) {
		t.Fatalf("tiny floor %v, want about 9 layers x 10 ms", floor)
	}
	// Compute is free, so the pass is its reads; the last layer (MLA: 100
	// rows of 80 bytes) takes 0.8 ms at 10 MB/s, then the RTT and a step.
	last := s.Model.Layers[len(s.Model.Layers)-1]
	tail := time.Duration(float64(last.State(100))/1e7*float64(time.Second)) + time.Millisecond
	if !near(j.Prefill, floor, time.Millisecond) || !near(j.TransferTail, tail, 20*time.Microsecond) {
		t.Fatalf("pass %v (floor %v), tail %v (want %v)", j.Prefill, floor, j.TransferTail, tail)
	}
	if j.TTFT != j.Queue+j.Prefill+j.TransferTail+j.FirstStep || j.FirstStep != 50*time.Millisecond {
		t.Fatalf("breakdown %+v does not add up to the TTFT", j)
	}
	if j.Bytes != s.Model.StateBytes(100) || r.LinkBytes != j.Bytes {
		t.Fatalf("moved %d bytes (link %d), want the whole state %d", j.Bytes, r.LinkBytes, s.Model.StateBytes(100))
	}
}

func TestJobsArrivingDuringAPassShareTheNext(t *testing.T) {
	s := tinySetup(t, "1GiB")
	jobs := []workload.Job{
		{ID: "a", Prompt: 200, Output: 1},
		{ID: "b", Arrival: 20 * time.Millisecond, Prompt: 300, Output: 1},
		{ID: "c", Arrival: 40 * time.Millisecond, Prompt: 400, Output: 1},
	}
	r := run(t, s, jobs, router.Remote)
	if len(r.Passes) != 2 || r.Passes[0].Jobs != 1 || r.Passes[1].Jobs != 2 || r.Passes[1].Tokens != 299+399 {
		t.Fatalf("passes %+v, want a then b+c together", r.Passes)
	}
	if r.Passes[1].Start != r.Passes[0].End {
		t.Fatalf("second pass starts at %v, the first ends at %v", r.Passes[1].Start, r.Passes[0].End)
	}
	b, c := r.Jobs[1], r.Jobs[2]
	if b.Arrival+b.Queue != r.Passes[1].Start || c.Arrival+c.Queue != r.Passes[1].Start {
		t.Fatalf("b and c should start with the second pass: %+v %+v", b, c)
	}
	sum := Summarize(r)
	if sum.JobsPerPass != 1.5 || sum.Completed != 3 || sum.Remote != 3 {
		t.Fatalf("summary %+v", sum)
	}
}

func TestALongPromptIsSplitIntoSuperChunksAndSentOnce(t *testing.T) {
	s := tinySetup(t, "4MB")
	r := run(t, s, []workload.Job{{ID: "long", Prompt: 2001, Output: 1}}, router.Remote)
	j := r.Jobs[0]
	if j.Refused != "" || j.Passes < 2 || len(r.Passes) != j.Passes {
		t.Fatalf("2000 tokens in a 4 MB budget: %d passes (%+v), refused %q", j.Passes, r.Passes, j.Refused)
	}
	tokens := 0
	for _, p := range r.Passes {
		tokens += p.Tokens
		if p.Tokens%64 != 0 && p != r.Passes[len(r.Passes)-1] {
			t.Fatalf("super-chunk of %d tokens is not a multiple of 64", p.Tokens)
		}
	}
	if tokens != 2000 || j.Bytes != s.Model.StateBytes(2000) {
		t.Fatalf("passes carried %d tokens and sent %d bytes; want 2000 and %d (sent in the last pass only)", tokens, j.Bytes, s.Model.StateBytes(2000))
	}
}

func TestRefusalsSayWhy(t *testing.T) {
	s := tinySetup(t, "1GiB")
	s.Decode.StateMemory = "100KB"
	r := run(t, s, []workload.Job{{ID: "big", Prompt: 5000, Output: 1}, {ID: "ok", Prompt: 10, Output: 1}}, router.Local)
	if !strings.Contains(r.Jobs[0].Refused, "decode group") || r.Jobs[1].Refused != "" {
		t.Fatalf("refusals: %q, %q", r.Jobs[0].Refused, r.Jobs[1].Refused)
	}
	s = tinySetup(t, "2MB")
	r = run(t, s, []workload.Job{{ID: "huge", Prompt: 20000, Output: 1}}, router.Remote)
	if !strings.Contains(r.Jobs[0].Refused, "memory budget") {
		t.Fatalf("a prompt whose state exceeds the budget: %q", r.Jobs[0].Refused)
	}
	if sum := Summarize(r); sum.Refused != 1 || sum.Completed != 0 {
		t.Fatalf("summary %+v", sum)
	}
}

func TestBreakdownAddsUpUnderLoad(t *testing.T) {
	s := tinySetup(t, "8MB")
	jobs, err := workload.Mix(workload.MixSpec{Seed: 3, Jobs: 60, PerMin: 120, ShortMin: 2, ShortMax: 200, LongMin: 500, LongMax: 3000,
		LongFraction: 0.3, OutputMin: 1, OutputMax: 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []router.Policy{router.Local, router.Remote, router.Auto, router.Threshold} {
		r := run(t, s, jobs, p)
		for _, j := range r.Jobs {
			if j.Refused != "" {
				t.Fatalf("%s: %s refused: %s", p, j.ID, j.Refused)
			}
			if j.TTFT <= 0 || j.TTFT != j.Queue+j.Prefill+j.TransferTail+j.FirstStep {
				t.Fatalf("%s: %s breakdown does not add up: %+v", p, j.ID, j)
			}
			if j.Done < j.FirstToken || j.FirstToken != j.Arrival+j.TTFT {
				t.Fatalf("%s: %s times: %+v", p, j.ID, j)
			}
			if (j.Target == router.TargetLocal) != (j.Bytes == 0 && j.TransferTail == 0) {
				t.Fatalf("%s: %s went %s but moved %d bytes with tail %v", p, j.ID, j.Target, j.Bytes, j.TransferTail)
			}
		}
		sum := Summarize(r)
		if sum.Completed != len(jobs) || sum.TTFTP50 > sum.TTFTP95 || sum.TTFTP95 > sum.TTFTP99 {
			t.Fatalf("%s summary %+v", p, sum)
		}
		if p == router.Threshold {
			for _, j := range r.Jobs {
				if (j.Prompt > 1000) != (j.Target == router.TargetRemote) {
					t.Fatalf("threshold 1000: %d tokens went %s", j.Prompt, j.Target)
				}
			}
		}
	}
}

func TestFitRate(t *testing.T) {
	// Exact points of a = 0.005 s, b = 1e-7 s per context position.
	pt := func(T int) RatePoint { return RatePoint{Tokens: T, TokPerS: 1 / (0.005 + 1e-7*float64(T-1)/2)} }
	a, b := fitRate([]RatePoint{pt(8192), pt(65536), pt(131072)})
	if d := a - 0.005; d > 1e-12 || d < -1e-12 || b < 0.99e-7 || b > 1.01e-7 {
		t.Fatalf("fit a=%v b=%v", a, b)
	}
	if a, b := fitRate([]RatePoint{{Tokens: 100, TokPerS: 50}}); a != 0.02 || b != 0 {
		t.Fatalf("one point: a=%v b=%v, want a flat 0.02 s/token", a, b)
	}
	// Rates that rise with length would need b < 0: a flat mean instead.
	if _, b := fitRate([]RatePoint{{Tokens: 100, TokPerS: 50}, {Tokens: 1000, TokPerS: 80}}); b != 0 {
		t.Fatalf("rising rate: b=%v, want 0", b)
	}
	// The chunked sum, priced by the cost model's terms, matches the
	// closed form of the average.
	m, err := LoadModel("tiny")
	if err != nil {
		t.Fatal(err)
	}
	c := newGroupCost(&DecodeGroup{PrefillRate: []RatePoint{pt(8192), pt(65536), pt(131072)}}, m)
	if got, want := c.Prefill(10000, 512).Seconds(), 10000*(0.005+1e-7*9999/2); got < want*0.999999 || got > want*1.000001 {
		t.Fatalf("chunked prefill %v s, want %v", got, want)
	}
}

func TestControlPlaneLatencyIsPartOfTheQueue(t *testing.T) {
	s := tinySetup(t, "1GiB")
	base := run(t, s, []workload.Job{{ID: "l", Prompt: 101, Output: 1}}, router.Local).Jobs[0]
	baseR := run(t, s, []workload.Job{{ID: "r", Prompt: 101, Output: 1}}, router.Remote).Jobs[0]
	s.Control = &ControlPlane{LocalMS: 3, RemoteMS: 7}
	l := run(t, s, []workload.Job{{ID: "l", Prompt: 101, Output: 1}}, router.Local).Jobs[0]
	r := run(t, s, []workload.Job{{ID: "r", Prompt: 101, Output: 1}}, router.Remote).Jobs[0]
	if l.TTFT-base.TTFT != 3*time.Millisecond || l.Queue != base.Queue+3*time.Millisecond {
		t.Fatalf("local: %+v, without the control plane %+v", l, base)
	}
	if r.TTFT-baseR.TTFT != 7*time.Millisecond || r.Queue != baseR.Queue+7*time.Millisecond {
		t.Fatalf("remote: %+v, without the control plane %+v", r, baseR)
	}
	s.Control = &ControlPlane{LocalMS: -1}
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "local_ms") {
		t.Fatalf("negative latency: %v", err)
	}
}

func TestARemoteJobIsAdmittedBetweenTheGroupsSteps(t *testing.T) {
	s := tinySetup(t, "1GiB")
	// The group prefills a local 1001-token prompt in two chunks (5.12 s
	// and 4.88 s at 100 tok/s); a remote job arriving 1 s in is admitted
	// when the first chunk ends, and only then joins a weight pass.
	jobs := []workload.Job{{ID: "local", Prompt: 1001, Output: 1}, {ID: "remote", Arrival: time.Second, Prompt: 2001, Output: 1}}
	r, err := Run(context.Background(), s, jobs, Options{Policy: router.Threshold, Threshold: 1500})
	if err != nil {
		t.Fatal(err)
	}
	l, rm := r.Jobs[0], r.Jobs[1]
	if l.Target != router.TargetLocal || rm.Target != router.TargetRemote {
		t.Fatalf("targets %s, %s", l.Target, rm.Target)
	}
	if rm.Queue != 5120*time.Millisecond-time.Second || len(r.Passes) != 1 || r.Passes[0].Start != 5120*time.Millisecond {
		t.Fatalf("remote job queued %v, passes %+v; want admission at the end of the first chunk (5.12 s)", rm.Queue, r.Passes)
	}
}

func TestShortPromptsQueuedTogetherShareAGroupStep(t *testing.T) {
	s := tinySetup(t, "1GiB")
	jobs := []workload.Job{{ID: "a", Prompt: 101, Output: 1}, {ID: "b", Prompt: 201, Output: 1}, {ID: "c", Prompt: 401, Output: 1}}
	r := run(t, s, jobs, router.Local)
	// a starts alone (100 rows, 1 s at 100 tok/s); b and c queue behind
	// it and share the next step of 512 rows: b whole and 312 rows of c
	// (5.12 s); then a 50 ms decode step for a and b, then c's last 88
	// rows (0.88 s).
	a, b, c := r.Jobs[0], r.Jobs[1], r.Jobs[2]
	if a.Prefill != time.Second || b.Prefill != 5120*time.Millisecond || c.Prefill != 6050*time.Millisecond {
		t.Fatalf("prefills a %v, b %v, c %v", a.Prefill, b.Prefill, c.Prefill)
	}
}
