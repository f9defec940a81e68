package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// The step core, rule by rule: a rank's view, a step and a result in,
// a plan or a message out; no ring, no model, no clock.

var rank2 = rankView{rank: 2, lo: 10, cols: 64, stack: 3}

func prefill(seqs []string, pos, rows []int32) *mesh.Step {
	return &mesh.Step{ID: 7, Phase: uint8(model.PhasePrefill), Seqs: seqs, Pos: pos, Rows: rows, Cols: 64, Stack: 3}
}

func decode(seqs ...string) *mesh.Step {
	st := &mesh.Step{ID: 7, Phase: uint8(model.PhaseDecode), Seqs: seqs, Cols: 64, Stack: 3}
	for range seqs {
		st.Pos, st.Rows = append(st.Pos, 5), append(st.Rows, 1)
	}
	return st
}

// verify is a decode step of sequences "a", "b", ... at pos with rows rows
// and the drafts.
func verify(pos, rows []int32, draft ...int32) *mesh.Step {
	st := &mesh.Step{ID: 7, Phase: uint8(model.PhaseDecode), Pos: pos, Rows: rows, Cols: 64, Stack: 3, Draft: draft}
	for i := range pos {
		st.Seqs = append(st.Seqs, string(rune('a'+i)))
	}
	return st
}

// held: every sequence named is held at token 5.
func held(ids ...string) map[string]seqView {
	m := map[string]seqView{}
	for _, id := range ids {
		m[id] = seqView{held: true, tokens: 5}
	}
	return m
}

// showPlan renders a plan compactly: "Fail(...)" or "Run(0:0-1 2:3-4) Skip(1-3) Rows(4)".
func showPlan(p stepPlan) string {
	if p.err != nil {
		return "Fail(" + p.err.Error() + ")"
	}
	var run, skip []string
	for k, i := range p.run {
		r := fmt.Sprintf("%d:%d-%d", i, p.spans[k].Lo, p.spans[k].Hi)
		if len(p.drafts[k]) > 0 {
			r += fmt.Sprintf(" draft%v", p.drafts[k])
		}
		if p.commit[k] > 0 {
			r += fmt.Sprintf(" commit %d", p.commit[k])
		}
		run = append(run, r)
	}
	for _, sp := range p.skip {
		skip = append(skip, fmt.Sprintf("%d-%d", sp.Lo, sp.Hi))
	}
	out := "Run(" + strings.Join(run, " ") + ")"
	if len(skip) > 0 {
		out += " Skip(" + strings.Join(skip, " ") + ")"
	}
	return out + fmt.Sprintf(" Rows(%d)", p.rows)
}

// showMsg renders a message compactly: "Step(a,b stack 4)", "Tokens(a=3 b:error)".
func showMsg(h *mesh.Header) string {
	switch h.Kind {
	case mesh.KindStep:
		out := fmt.Sprintf("Step(%s pos %v rows %v stack %d)", strings.Join(h.Step.Seqs, ","), h.Step.Pos, h.Step.Rows, h.Step.Stack)
		if len(h.Step.Draft) > 0 {
			out += fmt.Sprintf(" draft%v", h.Step.Draft)
		}
		return out
	case mesh.KindTokens:
		var rs []string
		for _, r := range h.Tokens.Results {
			s := fmt.Sprintf("%s=%d", r.Seq, r.Token)
			if len(r.Accepted) > 0 {
				s = fmt.Sprintf("%s=%v+%d", r.Seq, r.Accepted, r.Token)
			}
			if r.Done {
				s += ":" + r.Reason
			}
			rs = append(rs, s)
		}
		return "Tokens(" + strings.Join(rs, " ") + ")"
	}
	return h.Kind.String()
}

func TestPlanStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    rankView
		st   *mesh.Step
		seqs map[string]seqView
		want string
	}{
		{"a decode step runs every sequence, a row each", rank2, decode("a", "b"), held("a", "b"), "Run(0:0-1 1:1-2) Rows(2)"},
		{"a prefill step runs each sequence's rows", rank2, prefill([]string{"a", "b"}, []int32{5, 5}, []int32{3, 2}), held("a", "b"),
			"Run(0:0-3 1:3-5) Rows(5)"},
		{"unknown phase", rank2, &mesh.Step{Phase: 9, Seqs: []string{"a"}, Pos: []int32{5}, Rows: []int32{1}, Cols: 64, Stack: 3},
			held("a"), "Fail(unknown phase 9)"},
		{"no sequences", rank2, decode(), nil, "Fail(0 sequences with 0 positions and 0 row counts)"},
		{"positions short", rank2, prefill([]string{"a", "b"}, []int32{5}, []int32{1, 1}), held("a", "b"),
			"Fail(2 sequences with 1 positions and 2 row counts)"},
		{"row counts short", rank2, prefill([]string{"a"}, []int32{5}, nil), held("a"),
			"Fail(1 sequences with 1 positions and 0 row counts)"},
		{"width", rankView{rank: 2, lo: 10, cols: 32, stack: 3}, decode("a"), held("a"),
			"Fail(activations of width 64 with 3 blocks; layer 10 takes width 32 with 3)"},
		{"stack", rankView{rank: 2, lo: 10, cols: 64, stack: 4}, decode("a"), held("a"),
			"Fail(activations of width 64 with 3 blocks; layer 10 takes width 64 with 4)"},
		{"a verify step: a sequence's last token and its drafts", rank2, verify([]int32{5, 5}, []int32{3, 1}, 8, 9), held("a", "b"),
			"Run(0:0-3 draft[8 9] 1:3-4) Rows(4)"},
		{"a decode step of more rows than its drafts", rank2, verify([]int32{5}, []int32{2}), held("a"),
			`Fail(sequence "a" has 1 drafted rows; the step carries 0 drafts for them all)`},
		{"drafts left over", rank2, verify([]int32{5}, []int32{2}, 8, 9), held("a"),
			"Fail(the step carries 2 drafts, its sequences 1)"},
		{"drafts in a prefill step", rank2, func() *mesh.Step {
			st := prefill([]string{"a"}, []int32{5}, []int32{2})
			st.Draft = []int32{8}
			return st
		}(), held("a"), "Fail(the step carries 1 drafts, its sequences 0)"},
		{"more drafts than a step takes", rank2, verify([]int32{5}, []int32{2 + MaxDraft}, make([]int32, 1+MaxDraft)...), held("a"),
			fmt.Sprintf(`Fail(sequence "a" has %d rows in a decode step)`, 2+MaxDraft)},
		{"the step's position commits the last verify step's kept rows", rank2, decode("a"),
			map[string]seqView{"a": {held: true, tokens: 3, pending: 3}}, "Run(0:0-1 commit 2) Rows(1)"},
		{"all of a verify step kept", rank2, decode("a"),
			map[string]seqView{"a": {held: true, tokens: 2, pending: 3}}, "Run(0:0-1 commit 3) Rows(1)"},
		{"a commit of none: the head always keeps the last token", rank2, decode("a"),
			map[string]seqView{"a": {held: true, tokens: 5, pending: 3}},
			`Fail(sequence "a" is at token 5 here with a verify step of 3 rows pending; the step is for token 5)`},
		{"a commit of more rows than ran", rank2, decode("a"),
			map[string]seqView{"a": {held: true, tokens: 1, pending: 3}},
			`Fail(sequence "a" is at token 1 here with a verify step of 3 rows pending; the step is for token 5)`},
		{"a cancelled sequence's drafts are skipped with it", rank2, verify([]int32{5, 5}, []int32{3, 2}, 8, 9, 10),
			map[string]seqView{"a": {cancelled: true}, "b": {held: true, tokens: 5}}, "Run(1:3-5 draft[10]) Skip(0-3) Rows(5)"},
		{"a prefill step of no rows", rank2, prefill([]string{"a"}, []int32{5}, []int32{0}), held("a"),
			`Fail(sequence "a" has 0 rows in a prefill step)`},
		{"the row check comes before the cancel", rank2, prefill([]string{"a"}, []int32{5}, []int32{0}),
			map[string]seqView{"a": {cancelled: true}}, `Fail(sequence "a" has 0 rows in a prefill step)`},
		{"a sequence not held", rank2, decode("a", "b"), held("a"), `Fail(sequence "b" has no state on this rank)`},
		{"a sequence at another position", rank2, decode("a"), map[string]seqView{"a": {held: true, tokens: 6}},
			`Fail(sequence "a" is at token 6 here, the step is for token 5)`},
		{"a sequence behind the step", rank2, decode("a"), map[string]seqView{"a": {held: true, tokens: 4}},
			`Fail(sequence "a" is at token 4 here, the step is for token 5)`},
		{"cancelled sequences are skipped, their rows kept in the count", rank2,
			prefill([]string{"a", "b", "c"}, []int32{5, 9, 5}, []int32{3, 2, 4}),
			map[string]seqView{"a": {held: true, tokens: 5}, "b": {held: true, cancelled: true}, "c": {held: true, tokens: 5}},
			"Run(0:0-3 2:5-9) Skip(3-5) Rows(9)"},
		{"a cancelled sequence needs no state (torn or freed here)", rank2, decode("a", "b"),
			map[string]seqView{"a": {cancelled: true}, "b": {held: true, tokens: 5}}, "Run(1:1-2) Skip(0-1) Rows(2)"},
		{"every sequence cancelled: nothing to run", rank2, decode("a"), map[string]seqView{"a": {cancelled: true}},
			"Run() Skip(0-1) Rows(1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := showPlan(planStep(tc.v, tc.st, tc.seqs)); got != tc.want {
				t.Fatalf("planStep:\n got  %s\n want %s", got, tc.want)
			}
		})
	}
}

// TestFailStep: a step a rank cannot run ends each of its sequences with
// the error, naming the rank and the step, and goes to the head.
func TestFailStep(t *testing.T) {
	st := decode("a", "b")
	tr := mesh.Trace{Compute: []int64{1, 2, 3}}
	h, err := failStep(2, 4, st, tr, errors.New("boom"))
	if want := "decode rank 2: step 7: boom"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if got, want := showMsg(h), "Tokens(a=0:error b=0:error)"; got != want {
		t.Fatalf("report %s, want %s", got, want)
	}
	if h.Epoch != 4 || h.Tokens.Step != 7 || !slices.Equal(h.Tokens.Trace.Compute, tr.Compute) {
		t.Fatalf("report of epoch %d, step %d, trace %v", h.Epoch, h.Tokens.Step, h.Tokens.Trace)
	}
	for _, r := range h.Tokens.Results {
		if r.Err != err.Error() {
			t.Fatalf("result %+v does not carry the error", r)
		}
	}
}

func TestMerged(t *testing.T) {
	sp := func(lo, hi int) kernels.Span { return kernels.Span{Lo: lo, Hi: hi} }
	for _, tc := range []struct {
		spans, skip []kernels.Span
		want        []int
	}{
		{[]kernels.Span{sp(0, 3), sp(5, 9)}, []kernels.Span{sp(3, 5)}, []int{0, -1, 1}},
		{[]kernels.Span{sp(2, 3)}, []kernels.Span{sp(0, 2), sp(3, 4)}, []int{-1, 0, -1}},
		{nil, []kernels.Span{sp(0, 1)}, []int{-1}},
		{[]kernels.Span{sp(0, 1)}, nil, []int{0}},
	} {
		all, from := merged(tc.spans, tc.skip)
		if !slices.Equal(from, tc.want) {
			t.Fatalf("merged(%v, %v) from %v, want %v", tc.spans, tc.skip, from, tc.want)
		}
		for k := 1; k < len(all); k++ {
			if all[k].Lo != all[k-1].Hi {
				t.Fatalf("merged(%v, %v) = %v, not in payload order", tc.spans, tc.skip, all)
			}
		}
	}
}

// TestStepNext: where a computed step goes, and with which sequences.
func TestStepNext(t *testing.T) {
	st := prefill([]string{"a", "b", "c"}, []int32{5, 6, 7}, []int32{3, 2, 4})
	last := rank2
	last.last = true
	res := []mesh.Result{{Seq: "a", Token: 3}, {Seq: "c", Token: 4, Done: true, Reason: "stop"}}
	for _, tc := range []struct {
		name    string
		v       rankView
		still   []string
		results []mesh.Result
		want    string
	}{
		{"on to the next rank", rank2, []string{"a", "b", "c"}, nil, "Step(a,b,c pos [5 6 7] rows [3 2 4] stack 4)"},
		{"without the sequences torn here", rank2, []string{"a", "c"}, nil, "Step(a,c pos [5 7] rows [3 4] stack 4)"},
		{"the last rank's results back to the head", last, []string{"a", "c"}, res, "Tokens(a=3 c=4:stop)"},
		{"none left: an empty report to the head", rank2, nil, nil, "Tokens()"},
		{"none left on the last rank", last, nil, nil, "Tokens()"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := stepNext(tc.v, 4, st, mesh.Trace{SentAt: 1}, tc.still, 4, tc.results)
			if got := showMsg(h); got != tc.want {
				t.Fatalf("stepNext:\n got  %s\n want %s", got, tc.want)
			}
			if h.Epoch != 4 {
				t.Fatalf("epoch %d", h.Epoch)
			}
		})
	}
	if len(st.Seqs) != 3 || st.Stack != 3 {
		t.Fatalf("stepNext changed the step it came from: %+v", st)
	}
	// A verify step's drafts go on with their sequences.
	vs := verify([]int32{5, 6, 7}, []int32{3, 1, 2}, 8, 9, 10)
	if got, want := showMsg(stepNext(rank2, 4, vs, mesh.Trace{}, []string{"a", "b", "c"}, 4, nil)), "Step(a,b,c pos [5 6 7] rows [3 1 2] stack 4) draft[8 9 10]"; got != want {
		t.Fatalf("stepNext:\n got  %s\n want %s", got, want)
	}
	if got, want := showMsg(stepNext(rank2, 4, vs, mesh.Trace{}, []string{"b", "c"}, 4, nil)), "Step(b,c pos [6 7] rows [1 2] stack 4) draft[10]"; got != want {
		t.Fatalf("stepNext:\n got  %s\n want %s", got, want)
	}
	if got, want := showMsg(stepNext(rank2, 4, vs, mesh.Trace{}, []string{"a"}, 4, nil)), "Step(a pos [5] rows [3] stack 4) draft[8 9]"; got != want {
		t.Fatalf("stepNext:\n got  %s\n want %s", got, want)
	}
}

// TestKept: sequences a step dropped as it ran (torn) are not stepped on.
func TestKept(t *testing.T) {
	if got := kept([]string{"a", "b", "c"}, []bool{true, false, true}); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("kept = %v", got)
	}
	if got := kept([]string{"a"}, []bool{false}); len(got) != 0 {
		t.Fatalf("kept = %v", got)
	}
}

func TestSampledEnd(t *testing.T) {
	for _, tc := range []struct {
		stop, ended    bool
		generated, max int
		want           Reason
	}{
		{false, false, 3, 8, ""},
		{true, false, 3, 8, ReasonStop},
		{false, true, 3, 8, ReasonStop},    // the grammar's reply is complete
		{false, false, 8, 8, ReasonLength}, // the limit
		{true, false, 8, 8, ReasonStop},    // a stop token at the limit is a stop
		{false, false, 9, 8, ReasonLength}, // past it
	} {
		if got := sampledEnd(tc.stop, tc.ended, tc.generated, tc.max); got != tc.want {
			t.Errorf("sampledEnd(%v, %v, %d, %d) = %q, want %q", tc.stop, tc.ended, tc.generated, tc.max, got, tc.want)
		}
	}
}

func TestFreeOnLast(t *testing.T) {
	for _, tc := range []struct {
		r    mesh.Result
		pend bool
		want bool
	}{
		{mesh.Result{Done: false}, false, false},                         // going on
		{mesh.Result{Done: true, Reason: "stop"}, false, true},           // ended, nothing to keep
		{mesh.Result{Done: true, Reason: "length"}, true, false},         // keeps a cache entry: waits for Release
		{mesh.Result{Done: true, Reason: "error", Err: "x"}, true, true}, // an error keeps nothing
	} {
		if got := freeOnLast(tc.r, tc.pend); got != tc.want {
			t.Errorf("freeOnLast(%+v, %v) = %v, want %v", tc.r, tc.pend, got, tc.want)
		}
	}
}

func TestOnResult(t *testing.T) {
	tok := mesh.Result{Seq: "a", Token: 3}
	end := mesh.Result{Seq: "a", Token: 3, Done: true, Reason: "stop"}
	bad := mesh.Result{Seq: "a", Done: true, Reason: "error", Err: "boom"}
	dec, pre := model.PhaseDecode, model.PhasePrefill
	for _, tc := range []struct {
		name           string
		r              mesh.Result
		phase          model.Phase
		live, inflight bool
		want           resultAction
	}{
		{"a token", tok, dec, true, true, resultToken},
		{"a last token", end, dec, true, true, resultEnd},
		{"an error", bad, dec, true, true, resultFail},
		{"an error of a prefill step", bad, pre, true, false, resultFail},
		{"ended meanwhile", tok, dec, false, false, resultIgnore},
		{"an error for a sequence ended meanwhile", bad, dec, false, false, resultIgnore},
		{"a prefill step has no token", tok, pre, true, true, resultIgnore},
		{"not awaited", end, dec, true, false, resultIgnore},
	} {
		if got := onResult(tc.r, tc.phase, tc.live, tc.inflight); got != tc.want {
			t.Errorf("%s: onResult = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestHopTime(t *testing.T) {
	at := time.Unix(0, 1000)
	for _, tc := range []struct {
		sentAt, want int64
	}{{400, 600}, {0, 0}, {1500, 0}} { // unstamped; a clock ahead counts nothing
		if got := hopTime(tc.sentAt, at); got != tc.want {
			t.Errorf("hopTime(%d) = %d, want %d", tc.sentAt, got, tc.want)
		}
	}
}

// TestOnTickAction: the head's timer, with clock readings for a clock.
func TestOnTickAction(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	launched := map[uint64]time.Time{1: t0, 2: t0.Add(time.Second)}
	for _, tc := range []struct {
		name   string
		formed bool
		now    time.Time
		want   tickAction
		step   uint64
	}{
		{"not formed: the Form again", false, t0.Add(time.Hour), tickForm, 0},
		{"steps within the timeout", true, t0.Add(5 * time.Second), tickNone, 0},
		{"a step past it resets the ring", true, t0.Add(5*time.Second + 1), tickReset, 1},
	} {
		if act, id := onTickAction(tc.formed, launched, tc.now, 5*time.Second); act != tc.want || id != tc.step {
			t.Errorf("%s: onTickAction = %d, step %d; want %d, step %d", tc.name, act, id, tc.want, tc.step)
		}
	}
	if act, _ := onTickAction(true, nil, t0, time.Second); act != tickNone {
		t.Errorf("no step in flight: onTickAction = %d", act)
	}
}

func TestSlotDue(t *testing.T) {
	if !slotDue(false, 2) || slotDue(true, 2) || slotDue(false, 0) || slotDue(true, 0) {
		t.Fatal("a slot steps when it has members and no step in flight")
	}
}

func TestOnCancelAction(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		held, admitting, ended bool
		want                   cancelAction
	}{
		{"running: ends now", true, false, false, cancelEnd},
		{"admitting: ends when admitted", true, true, false, cancelAdmitting},
		{"ended by the step that dropped it", false, false, true, cancelDone},
		{"unknown", false, false, false, cancelUnknown},
		{"held again under its id: the step's end was another's", true, false, true, cancelEnd},
	} {
		if got := onCancelAction(tc.held, tc.admitting, tc.ended); got != tc.want {
			t.Errorf("%s: onCancelAction = %d, want %d", tc.name, got, tc.want)
		}
	}
}
