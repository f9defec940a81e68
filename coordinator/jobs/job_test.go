package jobs

import (
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
)

var t0 = time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func route(target cp.Target) Update {
	r := &cp.RouteDecision{Policy: cp.PolicyAuto, Target: target, PredictedLocal: time.Second,
		PredictedRemote: 2 * time.Second, DecodeGroup: "g"}
	if target == cp.TargetRemote {
		r.PrefillWorker = "p0"
	}
	return Update{Route: r}
}

func advance(t *testing.T, j *Job, s cp.JobState, ms int, u Update) cp.JobEvent {
	t.Helper()
	ev, err := j.Advance(s, at(ms), u)
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("event %d (%s) does not validate: %v", ev.Seq, s, err)
	}
	return ev
}

// TestRemoteLifecycleAndTiming walks a remote job through every state and
// checks the events and the breakdown.
func TestRemoteLifecycleAndTiming(t *testing.T) {
	j := New("j-1", t0, 1000)
	if ev := j.Queued("accepted"); ev.Seq != 1 || ev.State != cp.StateQueued {
		t.Fatalf("first event %+v", ev)
	}
	advance(t, j, cp.StateRouted, 2, route(cp.TargetRemote))
	advance(t, j, cp.StatePrefilling, 3, Update{Progress: &cp.LayerProgress{Done: 0, Total: 9}})
	advance(t, j, cp.StatePrefilling, 50, Update{Progress: &cp.LayerProgress{Done: 5, Total: 9}})
	advance(t, j, cp.StateTransferring, 100, Update{})
	advance(t, j, cp.StateDecoding, 130, Update{})
	j.Marks = Marks{PassStarted: at(10), PrefillDone: at(100), Committed: at(120), FirstToken: at(130),
		LastToken: at(230), OutputTokens: 11}
	ev := advance(t, j, cp.StateDone, 231, Update{})
	if ev.Seq != 7 || ev.Route == nil || ev.Route.PrefillWorker != "p0" {
		t.Fatalf("final event %+v", ev)
	}
	want := cp.Timing{Queue: 2 * time.Millisecond, PassWait: 8 * time.Millisecond, Prefill: 90 * time.Millisecond,
		TransferTail: 20 * time.Millisecond, FirstToken: 130 * time.Millisecond, Decode: 100 * time.Millisecond,
		Total: 231 * time.Millisecond, PromptTokens: 1000, OutputTokens: 11, DecodeTokensPerSec: 100}
	if *ev.Timing != want {
		t.Fatalf("timing\n got %+v\nwant %+v", *ev.Timing, want)
	}
	if _, err := j.Advance(cp.StateFailed, at(300), Update{Err: &cp.JobError{Message: "late"}}); err == nil {
		t.Fatal("a finished job failed again")
	}
}

// TestLocalJobSkipsTransfer: local jobs never transfer, and their prefill
// is the decode group's time to the first token.
func TestLocalJobSkipsTransfer(t *testing.T) {
	j := New("j-2", t0, 10)
	advance(t, j, cp.StateRouted, 0, route(cp.TargetRemote))
	advance(t, j, cp.StateRouted, 1, route(cp.TargetLocal)) // routed again: the prefill worker refused
	advance(t, j, cp.StatePrefilling, 2, Update{})
	if _, err := j.Advance(cp.StateTransferring, at(3), Update{}); err == nil || !strings.Contains(err.Error(), "no transfer") {
		t.Fatalf("local job transferring: %v", err)
	}
	advance(t, j, cp.StateDecoding, 12, Update{})
	j.Marks = Marks{FirstToken: at(12), LastToken: at(20), Decode: 7 * time.Millisecond, OutputTokens: 8}
	ev := advance(t, j, cp.StateDone, 21, Update{})
	if ev.Timing.Queue != time.Millisecond || ev.Route.Target != cp.TargetLocal || ev.Timing.Prefill != 10*time.Millisecond || ev.Timing.Decode != 7*time.Millisecond || ev.Timing.DecodeTokensPerSec != 1000 {
		t.Fatalf("timing %+v", ev.Timing)
	}
}

func TestForbiddenMoves(t *testing.T) {
	j := New("j-3", t0, 10)
	for _, c := range []struct {
		to   cp.JobState
		u    Update
		want string
	}{
		{cp.StatePrefilling, Update{}, "before it is routed"},
		{cp.StateRouted, Update{}, "without a routing decision"},
		{cp.StateFailed, Update{}, "without a reason"},
		{"exploded", Update{}, "not a lifecycle state"},
	} {
		if _, err := j.Advance(c.to, at(1), c.u); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.to, err, c.want)
		}
	}
	advance(t, j, cp.StateRouted, 1, route(cp.TargetLocal))
	advance(t, j, cp.StateDecoding, 2, Update{})
	for _, s := range []cp.JobState{cp.StateQueued, cp.StateRouted, cp.StatePrefilling, cp.StateDecoding} {
		u := Update{}
		if s == cp.StateRouted {
			u = route(cp.TargetLocal)
		}
		if _, err := j.Advance(s, at(3), u); err == nil {
			t.Errorf("decoding -> %s allowed", s)
		}
	}
	ev := advance(t, j, cp.StateCancelled, 4, Update{Detail: "by the client"})
	if j.State() != cp.StateCancelled || ev.Timing == nil || j.Entered(cp.StateCancelled) != at(4) {
		t.Fatalf("cancelled: %+v", ev)
	}
}

func TestTableListsNewestFirstAndForgetsOldFinished(t *testing.T) {
	tb := NewTable(2)
	var jobs []*Job
	for i := range 4 {
		j := New("j-"+string(rune('a'+i)), at(i), 1)
		jobs = append(jobs, j)
		tb.Own(j.ID, []string{"alice", "bob"}[i%2], cp.MsgPack)
		tb.Record(j.Queued(""))
	}
	if l := tb.List("bob", "", 0); len(l) != 2 || l[0].JobID != "j-d" || l[1].JobID != "j-b" {
		t.Fatalf("bob's jobs: %v", ids(l))
	}
	if l := tb.List("", "", 0); len(l) != 4 || l[0].JobID != "j-d" || l[3].JobID != "j-a" {
		t.Fatalf("list %v", ids(l))
	}
	for _, j := range jobs[:3] {
		tb.Record(advance(t, j, cp.StateCancelled, 10, Update{}))
	}
	// Only the two latest finished jobs are kept; a stale event does not
	// overwrite a newer one.
	tb.Record(jobs[3].Queued("again"))
	stale := jobs[3].Last()
	tb.Record(advance(t, jobs[3], cp.StateRouted, 11, route(cp.TargetLocal)))
	tb.Record(stale)
	if l := tb.List("", "", 0); len(l) != 3 || l[0].JobID != "j-d" || l[0].State != cp.StateRouted {
		t.Fatalf("list %v", ids(l))
	}
	if l := tb.List("", cp.StateCancelled, 1); len(l) != 1 || l[0].JobID != "j-c" {
		t.Fatalf("cancelled, limit 1: %v", ids(l))
	}
	if _, ok := tb.Get("j-a"); ok {
		t.Fatal("the oldest finished job is still held")
	}
	if _, ok := tb.Owner("j-a"); ok {
		t.Fatal("the oldest finished job's owner is still held")
	}
	if o, ok := tb.Owner("j-c"); !ok || o != "alice" {
		t.Fatalf("owner of j-c: %q %v", o, ok)
	}
	if n := tb.Counts(); n[cp.StateCancelled] != 2 || n[cp.StateRouted] != 1 {
		t.Fatalf("counts %v", n)
	}
	// A new run of a job (redelivered to a restarted coordinator) numbers
	// its events from 1 again and replaces the unfinished old run.
	again := New("j-d", at(0), 1)
	ev, _ := again.Advance(cp.StateRouted, at(50), route(cp.TargetLocal))
	tb.Record(ev)
	if got, _ := tb.Get("j-d"); got.Time != at(50) {
		t.Fatalf("restarted run not recorded: %+v", got)
	}
}

func ids(l []cp.JobEvent) []string {
	var out []string
	for _, e := range l {
		out = append(out, e.JobID+":"+string(e.State))
	}
	return out
}
