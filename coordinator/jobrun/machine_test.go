package jobrun

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// The machine is driven here event by event, with a clock that only moves
// when a test moves it: every decision of a job's run, without NATS.

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

var cfg = Config{Layers: 4, PlacementWait: 10 * time.Second, StallTimeout: 5 * time.Second, JobTimeout: time.Hour,
	ShutdownGrace: 2 * time.Second, RetryPause: 250 * time.Millisecond}

// show renders actions compactly: Publish(routed), Assign(d-r0), ...
func show(acts []Action) string {
	var out []string
	for _, a := range acts {
		switch a := a.(type) {
		case Publish:
			out = append(out, fmt.Sprintf("Publish(%s)", a.Event.State))
		case Assign:
			out = append(out, fmt.Sprintf("Assign(%s)", a.Worker))
		case CancelOn:
			out = append(out, fmt.Sprintf("CancelOn(%s)", strings.Join(a.Workers, ",")))
		case Settle:
			if a.Ack {
				out = append(out, "Ack")
			} else {
				out = append(out, "Release")
			}
		case Place:
			out = append(out, "Place")
		case Inquire:
			out = append(out, "Inquire")
		case Check:
			out = append(out, "Check("+a.Worker+")")
		case ReplyCancel:
			out = append(out, "ReplyCancel")
		case Bug:
			out = append(out, "Bug("+a.Err.Error()+")")
		default:
			out = append(out, strings.TrimPrefix(fmt.Sprintf("%T", a), "jobrun."))
		}
	}
	return strings.Join(out, " ")
}

func step(t *testing.T, m *Machine, ev Event, want string) []Action {
	t.Helper()
	acts := m.Step(ev)
	if got := show(acts); got != want {
		t.Fatalf("after %T:\n got  %s\n want %s", ev, got, want)
	}
	return acts
}

func localPlan() *Plan {
	return &Plan{Route: &cp.RouteDecision{Policy: cp.PolicyAuto, Target: cp.TargetLocal, DecodeGroup: "g", Reason: "short"},
		Group: "g", Head: "g-r0", Ranks: []string{"g-r0", "g-r1"}, Decode: &cp.Assignment{JobID: "j1"}}
}

func remotePlan() *Plan {
	p := localPlan()
	p.Route.Target, p.Route.PrefillWorker = cp.TargetRemote, "pf"
	p.Prefill, p.PrefillAssignment = "pf", &cp.Assignment{JobID: "j1", Role: cp.RolePrefill}
	return p
}

func accepted(w string) *cp.AssignReply {
	return &cp.AssignReply{JobID: "j1", WorkerID: w, Accepted: true}
}

func progress(w string, s cp.JobState, tokens int) *cp.Progress {
	p := &cp.Progress{JobID: "j1", WorkerID: w, Stage: s, Time: t0, Tokens: tokens}
	if s == cp.StateFailed {
		p.Error = &cp.JobError{Message: "boom"}
	}
	return p
}

func decodeDone(tokens int) *cp.Progress {
	p := progress("g-r0", cp.StateDone, tokens)
	p.Elapsed = time.Second
	p.Measured = &cp.Rates{DecodeTokensPerSec: 10}
	p.Output = &cp.Output{TokenIDs: []int32{7, 8, 9}, Text: "abc", FinishReason: cp.FinishLength}
	return p
}

func newMachine() *Machine { return New(cfg, "j1", t0, 12, cp.PolicyAuto) }

func TestLocalJobRunsToDone(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Candidate{At: at(1), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
	step(t, m, Assigned{At: at(2), Reply: accepted("g-r0")}, "LoadLocal AssignedAt Publish(prefilling)")
	step(t, m, Report{At: at(50), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
	step(t, m, Report{At: at(60), P: progress("g-r0", cp.StateDecoding, 3)}, "") // a sign of life only
	acts := step(t, m, Report{At: at(80), P: decodeDone(3)}, "ObserveDecodeStep Publish(done) Ack")
	ev := acts[1].(Publish).Event
	if ev.Output == nil || !slices.Equal(ev.Output.TokenIDs, []int32{7, 8, 9}) || ev.Output.Text != "abc" {
		t.Fatalf("final event output %+v, want the decode group's", ev.Output)
	}
	if ev.Timing == nil || ev.Timing.FirstToken != 50*time.Millisecond || ev.Timing.OutputTokens != 3 {
		t.Fatalf("timing %+v", ev.Timing)
	}
	if !m.Ended() || m.Final().State != cp.StateDone {
		t.Fatalf("ended %v final %v", m.Ended(), m.Final())
	}
	// Anything later changes nothing.
	step(t, m, Report{At: at(90), P: decodeDone(3)}, "")
}

// TestLocalJobFromThePrefixCache: the decode group's final report says how
// many prompt tokens came from its prefix cache: the final timing carries
// them and where, and the local prefill rate is observed over the tokens
// the group really prefilled.
func TestLocalJobFromThePrefixCache(t *testing.T) {
	m := newMachine() // a prompt of 12 tokens
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Candidate{At: at(1), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
	step(t, m, Assigned{At: at(2), Reply: accepted("g-r0")}, "LoadLocal AssignedAt Publish(prefilling)")
	step(t, m, Report{At: at(50), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
	done := decodeDone(3)
	done.Cached = 8
	done.Measured.PrefillTokensPerSec = 100 // 4 tokens in 40 ms
	acts := step(t, m, Report{At: at(80), P: done}, "ObserveDecodeStep ObserveLocalPrefill Publish(done) Ack")
	if o := acts[1].(ObserveLocalPrefill); o.Tokens != 4 || o.Time != 40*time.Millisecond {
		t.Fatalf("observed %+v, want the 4 prefilled tokens in 40 ms", o)
	}
	ev := acts[2].(Publish).Event
	if tm := ev.Timing; tm == nil || tm.CachedTokens != 8 || tm.CachedOn != "g-r0" || tm.PromptTokens != 12 {
		t.Fatalf("timing %+v, want 8 of 12 prompt tokens cached on g-r0", tm)
	}
	if err := ev.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestRemoteJobAssignsDecodeThenPrefill(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Candidate{At: at(1), Plan: remotePlan()}, "Publish(routed) Assign(g-r0)")
	step(t, m, Assigned{At: at(2), Reply: accepted("g-r0")}, "Assign(pf)")
	step(t, m, Assigned{At: at(3), Reply: accepted("pf")}, "LoadPrefill AssignedAt Publish(prefilling)")
	pp := progress("pf", cp.StatePrefilling, 5)
	pp.Layers = &cp.LayerProgress{Done: 2, Total: 4}
	step(t, m, Report{At: at(10), P: pp}, "LoadProgress Publish(prefilling)")
	step(t, m, Report{At: at(20), P: progress("pf", cp.StateTransferring, 11)}, "LoadForget Publish(transferring)")
	done := progress("pf", cp.StateDone, 11)
	done.Measured = &cp.Rates{PrefillTokensPerSec: 100, LinkBytesPerSec: 1e6}
	step(t, m, Report{At: at(25), P: done}, "ObservePass ObserveTransfer")
	// The prefill worker's part is over: it may leave (drained) with the
	// job still running on the group.
	step(t, m, WorkerLost{At: at(26), Worker: "pf", Since: at(26), Reason: "left the registry (shut down)"}, "")
	step(t, m, Report{At: at(30), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
	step(t, m, Report{At: at(40), P: decodeDone(3)}, "ObserveDecodeStep Publish(done) Ack")
}

// A prefill worker lost before it reported the state committed fails the
// job (its decode group is told to drop it).
func TestRemoteJobFailsWhenItsPrefillWorkerIsLost(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Candidate{At: at(1), Plan: remotePlan()}, "Publish(routed) Assign(g-r0)")
	step(t, m, Assigned{At: at(2), Reply: accepted("g-r0")}, "Assign(pf)")
	step(t, m, Assigned{At: at(3), Reply: accepted("pf")}, "LoadPrefill AssignedAt Publish(prefilling)")
	step(t, m, Report{At: at(20), P: progress("pf", cp.StateTransferring, 11)}, "LoadForget Publish(transferring)")
	step(t, m, WorkerLost{At: at(21), Worker: "pf", Since: at(21), Reason: "expired"}, "CancelOn(g-r0) Publish(failed) Ack")
}

// A worker that deregistered (drained, then left) published its final
// report first, but the coordinator reads reports and registry changes on
// different subscriptions: the report may come after the loss. The loss
// fails nothing while the report can still come; the decode group's head
// settles the job, and a report that never comes fails it after the stall
// timeout, naming the worker that left.
func TestWorkersThatLeftCleanly(t *testing.T) {
	left := "left the registry (shut down)"
	remote := func() *Machine {
		m := newMachine()
		step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
		step(t, m, Candidate{At: at(1), Plan: remotePlan()}, "Publish(routed) Assign(g-r0)")
		step(t, m, Assigned{At: at(2), Reply: accepted("g-r0")}, "Assign(pf)")
		step(t, m, Assigned{At: at(3), Reply: accepted("pf")}, "LoadPrefill AssignedAt Publish(prefilling)")
		return m
	}
	t.Run("prefill report after the loss", func(t *testing.T) {
		m := remote()
		step(t, m, WorkerLost{At: at(20), Worker: "pf", Since: at(20), Reason: left, Left: true}, "")
		step(t, m, Report{At: at(21), P: progress("pf", cp.StateDone, 11)}, "")
		step(t, m, Report{At: at(30), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
		step(t, m, Tick{At: at(5020)}, "") // its report came: nothing to settle
		step(t, m, Report{At: at(40), P: decodeDone(3)}, "ObserveDecodeStep Publish(done) Ack")
	})
	t.Run("prefill report lost, the group decodes", func(t *testing.T) {
		m := remote()
		step(t, m, WorkerLost{At: at(20), Worker: "pf", Since: at(20), Reason: left, Left: true}, "")
		step(t, m, Report{At: at(30), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
		step(t, m, Tick{At: at(5020)}, "") // decoding needs the committed state
		step(t, m, Report{At: at(40), P: decodeDone(3)}, "ObserveDecodeStep Publish(done) Ack")
	})
	t.Run("prefill side broken: the group fails the job", func(t *testing.T) {
		m := remote()
		step(t, m, WorkerLost{At: at(20), Worker: "pf", Since: at(20), Reason: left, Left: true}, "")
		step(t, m, Report{At: at(30), P: progress("g-r0", cp.StateFailed, 0)}, "CancelOn(pf) Publish(failed) Ack")
	})
	t.Run("prefill report never comes", func(t *testing.T) {
		m := remote()
		step(t, m, WorkerLost{At: at(20), Worker: "pf", Since: at(20), Reason: left, Left: true}, "")
		if got, want := m.Next(), at(20).Add(cfg.StallTimeout); !got.Equal(want) {
			t.Fatalf("next timer %v, want %v", got, want)
		}
		step(t, m, Tick{At: at(5019)}, "")
		acts := step(t, m, Tick{At: at(5020)}, "CancelOn(g-r0) Publish(failed) Ack")
		if e := acts[1].(Publish).Event.Error; e.Worker != "pf" || !strings.Contains(e.Message, left+" without a final report") {
			t.Fatalf("error %+v", e)
		}
	})
	t.Run("head report after the loss", func(t *testing.T) {
		m := remote()
		step(t, m, Report{At: at(10), P: progress("pf", cp.StateDone, 11)}, "")
		step(t, m, Report{At: at(30), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
		step(t, m, WorkerLost{At: at(40), Worker: "g-r0", Since: at(40), Reason: left, Left: true}, "")
		step(t, m, Report{At: at(41), P: decodeDone(3)}, "ObserveDecodeStep Publish(done) Ack")
	})
	t.Run("head report never comes", func(t *testing.T) {
		m := remote()
		step(t, m, Report{At: at(10), P: progress("pf", cp.StateDone, 11)}, "")
		step(t, m, WorkerLost{At: at(40), Worker: "g-r0", Since: at(40), Reason: left, Left: true}, "")
		acts := step(t, m, Tick{At: at(5040)}, "Publish(failed) Ack")
		if e := acts[0].(Publish).Event.Error; e.Worker != "g-r0" || !strings.Contains(e.Message, "without a final report") {
			t.Fatalf("error %+v", e)
		}
	})
	t.Run("another rank: the head settles", func(t *testing.T) {
		m := remote()
		step(t, m, Report{At: at(30), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
		step(t, m, WorkerLost{At: at(40), Worker: "g-r1", Since: at(40), Reason: left, Left: true}, "")
		step(t, m, Report{At: at(41), P: decodeDone(3)}, "ObserveDecodeStep Publish(done) Ack")
	})
}

// A job delivered again whose first run ended unobserved (the coordinator
// died first) is reported as it ended, never run again.
func TestRedeliveredJobThatEndedIsReportedNotRerun(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 2}}, "Inquire")
	reports := []WorkerReport{
		{Worker: "pf", Kind: cp.KindPrefill, Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "pf", Progress: progress("pf", cp.StateDone, 11)}},
		{Worker: "g-r0", Kind: cp.KindDecode, Group: "g", Ranks: []string{"g-r0", "g-r1"},
			Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0", Progress: decodeDone(3)}},
	}
	acts := step(t, m, Inquired{At: at(5), Reports: reports}, "Publish(routed) ObserveDecodeStep Publish(done) Ack")
	route := acts[0].(Publish).Event.Route
	if route.Target != cp.TargetRemote || route.DecodeGroup != "g" || !strings.Contains(route.Reason, "adopted") {
		t.Fatalf("adopted route %+v", route)
	}
	if out := acts[2].(Publish).Event.Output; out == nil || out.Text != "abc" {
		t.Fatalf("the adopted job's output %+v", out)
	}
}

// A job delivered again while its decode group still runs it is adopted:
// followed to its end, with no assignment.
func TestRedeliveredRunningJobIsAdopted(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 2}}, "Inquire")
	reports := []WorkerReport{
		{Worker: "pf", Kind: cp.KindPrefill, Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "pf"}}, // knows nothing: the job was local
		{Worker: "h-r0", Kind: cp.KindDecode, Group: "h", Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "h-r0"}},
		{Worker: "g-r0", Kind: cp.KindDecode, Group: "g", Ranks: []string{"g-r0", "g-r1"},
			Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0", Held: true, Progress: progress("g-r0", cp.StateDecoding, 40)}},
	}
	step(t, m, Inquired{At: at(5), Reports: reports}, "Publish(routed) LoadForget Publish(decoding)")
	// The stall timer runs from the adoption.
	if got, want := m.Next(), at(5).Add(cfg.StallTimeout); !got.Equal(want) {
		t.Fatalf("next timer %v, want the stall check at %v", got, want)
	}
	// A worker of the adopted group lost now fails it; one lost before
	// the adoption (a restart the registry recorded earlier) does not.
	step(t, m, WorkerLost{At: at(6), Worker: "g-r1", Reason: "old", Since: at(1)}, "")
	step(t, m, Report{At: at(100), P: decodeDone(50)}, "ObserveDecodeStep Publish(done) Ack")
}

func TestRedeliveredJobNobodyHasRunsAfresh(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports []WorkerReport
		want    string
	}{
		{"no answers", []WorkerReport{{Worker: "g-r0", Kind: cp.KindDecode, Group: "g"}}, "Place"},
		{"unknown everywhere", []WorkerReport{{Worker: "g-r0", Kind: cp.KindDecode, Group: "g",
			Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0"}}}, "Place"},
		// A stopping coordinator cancelled it on its workers and handed it
		// back: it runs again.
		{"cancelled on its workers", []WorkerReport{{Worker: "g-r0", Kind: cp.KindDecode, Group: "g",
			Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0", Progress: progress("g-r0", cp.StateCancelled, 2)}}}, "Place"},
		// The decode group lost it (restarted): the prefill is stopped.
		{"prefill without its decode group", []WorkerReport{{Worker: "pf", Kind: cp.KindPrefill,
			Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "pf", Held: true, Progress: progress("pf", cp.StatePrefilling, 0)}}}, "CancelOn(pf) Place"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMachine()
			step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 2}}, "Inquire")
			step(t, m, Inquired{At: at(1), Reports: tc.reports}, tc.want)
		})
	}
}

// An assignment answered Resumed (the worker had the job already: the
// inquiry missed it, e.g. the worker was still reconnecting) is adopted,
// and the prefill worker gets nothing. The workers are asked once more,
// so that the adopted route says how the earlier delivery ran the job.
func TestResumedAssignmentIsAdoptedWithoutPrefill(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 2}}, "Inquire")
	step(t, m, Inquired{At: at(1)}, "Place")
	step(t, m, Candidate{At: at(2), Plan: remotePlan()}, "Publish(routed) Assign(g-r0)")
	rep := accepted("g-r0")
	rep.Resumed, rep.Progress = true, progress("g-r0", cp.StatePrefilling, 0)
	step(t, m, Assigned{At: at(3), Reply: rep}, "Inquire")
	// The second inquiry finds both sides: the route is remote.
	acts := step(t, m, Inquired{At: at(4), Reports: []WorkerReport{
		{Worker: "pf", Kind: cp.KindPrefill, Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "pf", Progress: progress("pf", cp.StateDone, 11)}},
		{Worker: "g-r0", Kind: cp.KindDecode, Group: "g", Ranks: []string{"g-r0", "g-r1"},
			Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0", Held: true, Progress: progress("g-r0", cp.StatePrefilling, 0)}},
	}}, "Publish(routed) Publish(prefilling)")
	if rd := acts[0].(Publish).Event.Route; rd.Target != cp.TargetRemote || rd.PrefillWorker != "pf" {
		t.Fatalf("adopted route %+v, want remote through pf", rd)
	}
	step(t, m, Report{At: at(9), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
	step(t, m, Report{At: at(10), P: decodeDone(3)}, "ObserveDecodeStep Publish(done) Ack")

	// Resumed with a final report: reported as it ended.
	m = newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Candidate{At: at(2), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
	rep = accepted("g-r0")
	rep.Resumed, rep.Progress = true, decodeDone(3)
	step(t, m, Assigned{At: at(3), Reply: rep}, "Inquire")
	// The second inquiry gets no answer: placed again, the Resumed answer
	// is adopted as it is.
	step(t, m, Inquired{At: at(4)}, "Place")
	step(t, m, Candidate{At: at(5), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
	step(t, m, Assigned{At: at(6), Reply: rep}, "Publish(routed) ObserveDecodeStep Publish(done) Ack")
}

func TestPlacementRetriesThenGivesUp(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Candidate{At: at(1), Why: "no decode group is up"}, "")
	step(t, m, WorkersChanged{At: at(2)}, "Place")
	step(t, m, Candidate{At: at(3), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
	refused := &cp.AssignReply{JobID: "j1", WorkerID: "g-r0", Error: "no memory", Code: cp.CodeUnavailable}
	step(t, m, Assigned{At: at(4), Reply: refused}, "")
	// Registry changes do not hurry a retry after a refusal; the pause does.
	step(t, m, WorkersChanged{At: at(5)}, "")
	step(t, m, Tick{At: at(100)}, "")
	step(t, m, Tick{At: at(254)}, "Place")
	step(t, m, Candidate{At: at(255), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
	step(t, m, Assigned{At: at(256), NoResponders: true}, "")
	if got := m.Next(); !got.Equal(at(506)) {
		t.Fatalf("retry at %v", got)
	}
	step(t, m, Tick{At: at(506)}, "Place")
	step(t, m, Candidate{At: at(507), Why: "no decode group has room"}, "")
	acts := step(t, m, Tick{At: at(10000)}, "Publish(failed) Ack")
	if e := acts[0].(Publish).Event.Error; e.Code != cp.CodeUnavailable || !strings.Contains(e.Message, "no room") && !strings.Contains(e.Message, "has room") {
		t.Fatalf("error %+v", e)
	}
}

// TestHeadLostWithTheAssignmentUnanswered: rank 0 lost before it answered
// (it may have streamed tokens already): the job fails with the loss, is
// not placed again, and nothing is asked of the dead rank.
func TestHeadLostWithTheAssignmentUnanswered(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Candidate{At: at(1), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
	acts := step(t, m, Assigned{At: at(2), Lost: "heartbeat expired"}, "Publish(failed) Ack")
	if e := acts[0].(Publish).Event.Error; e.Worker != "g-r0" || e.Code != cp.CodeUnavailable || e.Message != "heartbeat expired" {
		t.Fatalf("error %+v", e)
	}
}

func TestUnreachablePrefillWorkerIsLeftOut(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Candidate{At: at(1), Why: "prefill worker pf does not answer", Unreachable: "pf"}, "")
	acts := step(t, m, Tick{At: at(251)}, "Place")
	if ex := acts[0].(Place).Exclude; !slices.Equal(ex, []string{"pf"}) {
		t.Fatalf("exclude %v", ex)
	}
}

func TestPrefillSideFailures(t *testing.T) {
	setup := func() *Machine {
		m := newMachine()
		step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
		step(t, m, Candidate{At: at(1), Plan: remotePlan()}, "Publish(routed) Assign(g-r0)")
		step(t, m, Assigned{At: at(2), Reply: accepted("g-r0")}, "Assign(pf)")
		return m
	}
	// Once the decode group admitted the job, it is not tried again.
	m := setup()
	step(t, m, Assigned{At: at(3), NoResponders: true}, "Publish(failed) Ack CancelOn(g-r0)")
	m = setup()
	step(t, m, Assigned{At: at(3), Err: errors.New("timeout")}, "CancelOn(pf,g-r0) Publish(failed) Ack")
	// Lost with the assignment unanswered: the loss is the reason, and
	// nothing is asked of the dead worker.
	m = setup()
	acts := step(t, m, Assigned{At: at(3), Lost: "heartbeat expired"}, "CancelOn(g-r0) Publish(failed) Ack")
	if e := acts[1].(Publish).Event.Error; e.Worker != "pf" || e.Message != "heartbeat expired" {
		t.Fatalf("error %+v", e)
	}
	m = setup()
	step(t, m, Assigned{At: at(3), Reply: &cp.AssignReply{JobID: "j1", WorkerID: "pf", Error: "bad", Code: cp.CodeBadRequest}},
		"CancelOn(g-r0) Publish(failed) Ack")
	m = setup()
	step(t, m, Assigned{At: at(3), Reply: accepted("pf")}, "LoadPrefill AssignedAt Publish(prefilling)")
	acts = step(t, m, Report{At: at(4), P: progress("pf", cp.StateFailed, 0)}, "CancelOn(g-r0) Publish(failed) Ack")
	if e := acts[1].(Publish).Event.Error; e.Worker != "pf" || e.Message != "boom" {
		t.Fatalf("error %+v", e)
	}
}

func TestTimersLostWorkersCancelAndShutdown(t *testing.T) {
	following := func() *Machine {
		m := newMachine()
		step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
		step(t, m, Candidate{At: at(1000), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
		step(t, m, Assigned{At: at(1002), Reply: accepted("g-r0")}, "LoadLocal AssignedAt Publish(prefilling)")
		return m
	}
	t.Run("stall", func(t *testing.T) {
		m := following()
		step(t, m, Report{At: at(2000), P: progress("g-r0", cp.StateDecoding, 1)}, "LoadForget Publish(decoding)")
		step(t, m, Tick{At: at(6999)}, "")
		step(t, m, Tick{At: at(7000)}, "Check(g-r0)")
		step(t, m, Checked{At: at(7001), Err: errors.New("timeout")}, "CancelOn(g-r0) Publish(failed) Ack")
	})
	t.Run("lost", func(t *testing.T) {
		m := following()
		step(t, m, WorkerLost{At: at(1500), Worker: "x", Since: at(1500)}, "")   // not ours
		step(t, m, WorkerLost{At: at(1500), Worker: "g-r1", Since: at(900)}, "") // restarted before it got the job
		step(t, m, WorkerLost{At: at(1500), Worker: "g-r1", Since: at(1400), Reason: "expired"}, "CancelOn(g-r0) Publish(failed) Ack")
	})
	t.Run("cancel", func(t *testing.T) {
		m := following()
		step(t, m, Cancel{At: at(1500), Reason: "client"}, "CancelOn(g-r0) Publish(cancelled) Ack ReplyCancel")
		step(t, m, Cancel{At: at(1600), Reason: "again"}, "ReplyCancel")
	})
	t.Run("cancel while placing", func(t *testing.T) {
		m := newMachine()
		step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
		step(t, m, Candidate{At: at(1), Why: "none"}, "")
		step(t, m, Cancel{At: at(2), Reason: "client"}, "Publish(cancelled) Ack ReplyCancel")
	})
	t.Run("shutdown", func(t *testing.T) {
		m := following()
		step(t, m, Shutdown{At: at(1500)}, "")
		step(t, m, Tick{At: at(3499)}, "")
		step(t, m, Tick{At: at(3500)}, "CancelOn(g-r0) Release")
		if m.Final() != nil {
			t.Fatal("a job handed back has no final event")
		}
		m = newMachine()
		step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
		step(t, m, Candidate{At: at(1), Why: "none"}, "")
		step(t, m, Shutdown{At: at(2)}, "Release")
	})
	t.Run("job timeout", func(t *testing.T) {
		m := following()
		step(t, m, Tick{At: t0.Add(time.Hour)}, "CancelOn(g-r0) Publish(failed) Ack")
	})
}

func TestDeliveryOutcomesAtStart(t *testing.T) {
	for _, tc := range []struct {
		d    Delivery
		want string
	}{
		{Delivery{NumDelivered: 1, Cancelled: "client"}, "Publish(cancelled) Ack"},
		{Delivery{NumDelivered: 5, LastAttempt: true}, "Publish(failed) Ack"},
		{Delivery{NumDelivered: 1, Refused: &cp.JobError{Code: cp.CodeTooLarge, Message: "too long"}}, "Publish(failed) Ack"},
		{Delivery{NumDelivered: 3}, "Inquire"},
	} {
		m := newMachine()
		step(t, m, Start{At: at(0), Delivery: tc.d}, tc.want)
	}
}

// TestSilentJobIsCheckedWithItsGroup: a decoding job silent for the stall
// timeout (its reports lost with a NATS server, or the group stuck) is
// failed only after its decode group was asked, and as the group answers.
func TestSilentJobIsCheckedWithItsGroup(t *testing.T) {
	decoding := func(t *testing.T) *Machine {
		m := newMachine()
		step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
		step(t, m, Candidate{At: at(1), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
		step(t, m, Assigned{At: at(2), Reply: accepted("g-r0")}, "LoadLocal AssignedAt Publish(prefilling)")
		step(t, m, Report{At: at(1000), P: progress("g-r0", cp.StateDecoding, 4)}, "LoadForget Publish(decoding)")
		step(t, m, Tick{At: at(6000)}, "Check(g-r0)")
		step(t, m, Tick{At: at(6001)}, "") // one check at a time
		return m
	}
	status := func(held bool, p *cp.Progress) *cp.JobStatusReply {
		return &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0", Held: held, Progress: p}
	}
	t.Run("ended: its final report is taken", func(t *testing.T) {
		m := decoding(t)
		acts := step(t, m, Checked{At: at(6010), Reply: status(false, decodeDone(3))}, "ObserveDecodeStep Publish(done) Ack")
		ev := acts[1].(Publish).Event
		if ev.Output == nil || ev.Output.Text != "abc" || !slices.Equal(ev.Output.TokenIDs, []int32{7, 8, 9}) {
			t.Fatalf("output %+v, want the group's final report's", ev.Output)
		}
	})
	t.Run("failed there", func(t *testing.T) {
		m := decoding(t)
		step(t, m, Checked{At: at(6010), Reply: status(false, progress("g-r0", cp.StateFailed, 5))}, "Publish(failed) Ack")
		if e := m.Final().Error; e == nil || e.Message != "boom" {
			t.Fatalf("error %+v, want the group's", e)
		}
	})
	t.Run("still decoding: keeps waiting", func(t *testing.T) {
		m := decoding(t)
		step(t, m, Checked{At: at(6010), Reply: status(true, progress("g-r0", cp.StateDecoding, 9))}, "")
		if got, want := m.Next(), at(6010).Add(cfg.StallTimeout); !got.Equal(want) {
			t.Fatalf("next check at %v, want %v", got, want)
		}
		// Silent again, and this time no token came since 9: stuck.
		step(t, m, Tick{At: at(11010)}, "Check(g-r0)")
		step(t, m, Checked{At: at(11011), Reply: status(true, progress("g-r0", cp.StateDecoding, 9))}, "CancelOn(g-r0) Publish(failed) Ack")
		if e := m.Final().Error; e == nil || !strings.Contains(e.Message, "holds the job with no token since (9 so far)") {
			t.Fatalf("error %+v", e)
		}
	})
	t.Run("unknown there", func(t *testing.T) {
		m := decoding(t)
		step(t, m, Checked{At: at(6010), Reply: status(false, nil)}, "CancelOn(g-r0) Publish(failed) Ack")
		if e := m.Final().Error; e == nil || !strings.Contains(e.Message, "no longer knows the job") {
			t.Fatalf("error %+v", e)
		}
	})
	t.Run("an answer for another worker is no answer", func(t *testing.T) {
		m := decoding(t)
		r := status(false, decodeDone(3))
		r.WorkerID = "g-r1"
		step(t, m, Checked{At: at(6010), Reply: r}, "CancelOn(g-r0) Publish(failed) Ack")
	})
	t.Run("a late answer changes nothing", func(t *testing.T) {
		m := decoding(t)
		step(t, m, Report{At: at(6005), P: decodeDone(3)}, "ObserveDecodeStep Publish(done) Ack")
		step(t, m, Checked{At: at(6010), Reply: status(false, nil)}, "")
	})
}

// TestReconnectedRunAsksItsGroup: after the coordinator's connection came
// back, a run that follows a job asks its decode group, takes an end it
// missed, and otherwise keeps its timers.
func TestReconnectedRunAsksItsGroup(t *testing.T) {
	status := func(held bool, p *cp.Progress) *cp.JobStatusReply {
		return &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0", Held: held, Progress: p}
	}
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 1}}, "Place")
	step(t, m, Reconnected{At: at(1)}, "") // nothing assigned yet
	step(t, m, Candidate{At: at(1), Plan: localPlan()}, "Publish(routed) Assign(g-r0)")
	step(t, m, Assigned{At: at(2), Reply: accepted("g-r0")}, "LoadLocal AssignedAt Publish(prefilling)")
	// Before the first token: the group holds the job, still prefilling.
	step(t, m, Reconnected{At: at(100)}, "Check(g-r0)")
	step(t, m, Checked{At: at(101), Reply: status(true, progress("g-r0", cp.StatePrefilling, 0))}, "")
	// Its first-token report was lost: the check finds it decoding.
	step(t, m, Reconnected{At: at(500)}, "Check(g-r0)")
	step(t, m, Checked{At: at(501), Reply: status(true, progress("g-r0", cp.StateDecoding, 3))}, "LoadForget Publish(decoding)")
	// Unknown or no answer after a reconnection fails nothing.
	step(t, m, Reconnected{At: at(600)}, "Check(g-r0)")
	step(t, m, Checked{At: at(601), Err: errors.New("no responders")}, "")
	if got, want := m.Next(), at(501).Add(cfg.StallTimeout); !got.Equal(want) {
		t.Fatalf("next timer %v, want the stall check at %v", got, want)
	}
	// Its final report was lost: the check ends the job.
	step(t, m, Reconnected{At: at(900)}, "Check(g-r0)")
	step(t, m, Checked{At: at(901), Reply: status(false, decodeDone(3))}, "ObserveDecodeStep Publish(done) Ack")
	step(t, m, Reconnected{At: at(950)}, "")
}

// A redelivered job its decode group holds, while a prefill worker did
// not answer the inquiry, is asked about once more after a pause: the
// adopted route then names the prefill worker that ran it.
func TestInquiryAsksASilentPrefillWorkerAgain(t *testing.T) {
	held := WorkerReport{Worker: "g-r0", Kind: cp.KindDecode, Group: "g", Ranks: []string{"g-r0", "g-r1"},
		Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0", Held: true, Progress: progress("g-r0", cp.StateDecoding, 40)}}
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 2}}, "Inquire")
	step(t, m, Inquired{At: at(1), Reports: []WorkerReport{{Worker: "pf", Kind: cp.KindPrefill}, held}}, "")
	step(t, m, Tick{At: at(250)}, "")
	step(t, m, Tick{At: at(251)}, "Inquire")
	acts := step(t, m, Inquired{At: at(260), Reports: []WorkerReport{
		{Worker: "pf", Kind: cp.KindPrefill, Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "pf", Progress: progress("pf", cp.StateDone, 11)}}, held}},
		"Publish(routed) LoadForget Publish(decoding)")
	if rd := acts[0].(Publish).Event.Route; rd.Target != cp.TargetRemote || rd.PrefillWorker != "pf" {
		t.Fatalf("adopted route %+v", rd)
	}

	// Silent again: adopted as the decode group says, once.
	m = newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 2}}, "Inquire")
	step(t, m, Inquired{At: at(1), Reports: []WorkerReport{{Worker: "pf", Kind: cp.KindPrefill}, held}}, "")
	step(t, m, Tick{At: at(251)}, "Inquire")
	step(t, m, Inquired{At: at(260), Reports: []WorkerReport{{Worker: "pf", Kind: cp.KindPrefill}, held}}, "Publish(routed) LoadForget Publish(decoding)")
}

// A job adopted while a prefill worker stays silent (it was reconnecting
// through both inquiries): the route cannot name the prefill worker, and
// its reason says the path is not known.
func TestAdoptedWithASilentPrefillWorker(t *testing.T) {
	m := newMachine()
	step(t, m, Start{At: at(0), Delivery: Delivery{NumDelivered: 2}}, "Inquire")
	reports := []WorkerReport{
		{Worker: "pf", Kind: cp.KindPrefill}, // no answer
		{Worker: "g-r0", Kind: cp.KindDecode, Group: "g", Ranks: []string{"g-r0", "g-r1"},
			Reply: &cp.JobStatusReply{JobID: "j1", WorkerID: "g-r0", Held: true, Progress: progress("g-r0", cp.StateDecoding, 40)}},
	}
	step(t, m, Inquired{At: at(5), Reports: reports}, "") // asked again after a pause
	step(t, m, Tick{At: at(5).Add(cfg.RetryPause)}, "Inquire")
	acts := step(t, m, Inquired{At: at(300), Reports: reports}, "Publish(routed) LoadForget Publish(decoding)")
	rd := acts[0].(Publish).Event.Route
	if rd.Target != cp.TargetLocal || rd.PrefillWorker != "" || !strings.Contains(rd.Reason, "not known") {
		t.Fatalf("adopted route %+v, want local with the unknown prefill said", rd)
	}
}
