package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func finalReport(job string, stage JobState) *Progress {
	p := &Progress{JobID: job, WorkerID: "w", Stage: stage, Time: time.Unix(1, 0)}
	if stage == StateFailed {
		p.Error = &JobError{Message: "boom"}
	}
	return p
}

func TestEndedIsBoundedInNumberAndAge(t *testing.T) {
	now := time.Unix(1000, 0)
	e := NewEnded(3, time.Minute)
	for i := range 5 {
		e.Put(finalReport(fmt.Sprintf("j%d", i), StateDone), now.Add(time.Duration(i)*time.Second))
	}
	for i := range 5 {
		_, ok := e.Get(fmt.Sprintf("j%d", i), now.Add(5*time.Second))
		if ok != (i >= 2) {
			t.Fatalf("j%d remembered %v; want only the newest 3", i, ok)
		}
	}
	if _, ok := e.Get("j4", now.Add(2*time.Minute)); ok {
		t.Fatal("a report older than the retention is forgotten")
	}
	e.Drop("j3")
	if _, ok := e.Get("j3", now.Add(5*time.Second)); ok {
		t.Fatal("a dropped job is forgotten")
	}
	// Puts far past the retention do not keep old ids around.
	for i := range 100 {
		e.Put(finalReport(fmt.Sprintf("k%d", i), StateDone), now.Add(time.Hour+time.Duration(i)*time.Second))
	}
	if len(e.m) > 3 || len(e.order) > 6 {
		t.Fatalf("%d reports, %d ids held; want at most 3 and 6", len(e.m), len(e.order))
	}
	p, ok := e.Get("k99", now.Add(time.Hour+99*time.Second))
	if !ok || p.JobID != "k99" || p.Stage != StateDone {
		t.Fatalf("newest report %+v %v", p, ok)
	}
}

func TestResumeMessagesValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    Message
		want string // "" valid, else a substring of the error
	}{
		{"status unknown", &JobStatusReply{JobID: "j1", WorkerID: "w"}, ""},
		{"status held", &JobStatusReply{JobID: "j1", WorkerID: "w", Held: true, Progress: finalReport("j1", StateDecoding)}, ""},
		{"status ended", &JobStatusReply{JobID: "j1", WorkerID: "w", Progress: finalReport("j1", StateDone)}, ""},
		{"status held with a final report", &JobStatusReply{JobID: "j1", WorkerID: "w", Held: true, Progress: finalReport("j1", StateDone)}, "JobStatusReply.held"},
		{"status of another job", &JobStatusReply{JobID: "j1", WorkerID: "w", Progress: finalReport("j2", StateDone)}, "progress.job_id"},
		{"status refusal", &JobStatusReply{Error: "bad", Code: CodeBadRequest}, ""},
		{"resumed refusal", &AssignReply{JobID: "j1", WorkerID: "w", Resumed: true, Error: "no", Code: CodeConflict}, "resumed"},
		{"output on a running report", &Progress{JobID: "j1", WorkerID: "w", Stage: StateDecoding, Time: time.Unix(1, 0), Output: &Output{}}, "Progress.output"},
		{"negative output token", &Progress{JobID: "j1", WorkerID: "w", Stage: StateDone, Time: time.Unix(1, 0), Output: &Output{TokenIDs: []int32{3, -1}}}, "output.token_ids[1]"},
		{"output on a running event", &JobEvent{JobID: "j1", Seq: 2, State: StateRouted, Time: time.Unix(1, 0), Output: &Output{}}, "JobEvent.output"},
		{"list one job", &ListJobsRequest{JobID: "j1"}, ""},
		{"list a bad id", &ListJobsRequest{JobID: "j 1"}, "ListJobsRequest.job_id"},
	} {
		err := tc.m.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}

func TestResultsKeepFinalEvents(t *testing.T) {
	srv := startEmbedded(t, security{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := OpenResults(ctx, connect(t, Options{URL: srv.url}), ResultsConfig{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	ev := &JobEvent{JobID: "j1", Seq: 5, State: StateDone, Time: time.Unix(5, 0).UTC(), Submitted: time.Unix(1, 0).UTC(),
		Output: &Output{TokenIDs: []int32{4, 5, 6}, Text: "abc", FinishReason: FinishLength}}
	if err := r.Put(ctx, "alice", ev); err != nil {
		t.Fatal(err)
	}
	got, ok, err := r.Get(ctx, "alice", "j1")
	if err != nil || !ok || got.State != StateDone || !slices.Equal(got.Output.TokenIDs, ev.Output.TokenIDs) || got.Output.Text != "abc" {
		t.Fatalf("get: %+v %v %v", got, ok, err)
	}
	if _, ok, err := r.Get(ctx, "alice", "j2"); ok || err != nil {
		t.Fatalf("an unknown job: %v %v", ok, err)
	}
	if _, ok, err := r.Get(ctx, "bob", "j1"); ok || err != nil {
		t.Fatalf("another client's job: %v %v", ok, err)
	}
	if err := r.Put(ctx, "alice", &JobEvent{JobID: "j3", Seq: 1, State: StateQueued, Time: time.Unix(1, 0)}); err == nil {
		t.Fatal("a job that has not ended has no result")
	}
}

// A runner that has sent its final report but not yet put the job away
// (the window CI once hit) reports the job ended, never held with a final
// report, which no peer would accept.
func TestStatusOfARunnerPuttingAJobAway(t *testing.T) {
	for _, tc := range []struct {
		name     string
		p        *Progress
		running  bool
		held     bool
		finished bool
	}{
		{"unknown", nil, false, false, false},
		{"admitting", nil, true, true, false},
		{"decoding", finalReport("j1", StateDecoding), true, true, false},
		{"ended, runner still there", finalReport("j1", StateDone), true, false, true},
		{"cancelled, runner still there", finalReport("j1", StateCancelled), true, false, true},
		{"ended, put away", finalReport("j1", StateDone), false, false, true},
	} {
		r := StatusOf("j1", "w", tc.p, tc.running)
		if err := r.Validate(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if r.Held != tc.held || r.Finished() != tc.finished {
			t.Errorf("%s: held %v finished %v, want %v %v", tc.name, r.Held, r.Finished(), tc.held, tc.finished)
		}
	}
}
