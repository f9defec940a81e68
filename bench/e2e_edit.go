package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tandem-inference/tandem/bench/workload"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/decode-worker/draft"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/tokenizer"
)

// The edit workload (bench e2e --workload edit): each job asks the model
// to rewrite a passage with a few words changed, so the reply repeats its
// prompt, which is what prompt-lookup drafting feeds on. With synthetic
// weights the reply is what the weights make of it, so the workload also
// runs with forced drafts: the model's own continuation (recorded from the
// run without drafts) with errors planted at a chosen rate.

// editOutput is the JSON line of --workload edit.
type editOutput struct {
	Model        string  `json:"model"`
	Ranks        int     `json:"ranks"`
	Jobs         int     `json:"jobs"`
	Rounds       int     `json:"rounds"`
	MedianPrompt int     `json:"median_prompt_tokens"`
	OutputTokens int     `json:"output_tokens"`
	TokSNoDraft  float64 `json:"tok_s_no_draft"`
	TokS         float64 `json:"tok_s"`
	// TokSRatio is tok_s over tok_s_no_draft, both measured in the same
	// run, rounds alternating.
	TokSRatio       float64 `json:"tok_s_ratio"`
	AcceptedPerStep float64 `json:"accepted_per_step"`
	Drafted         int     `json:"drafted_tokens"`
	Accepted        int     `json:"accepted_tokens"`
	// Forced is the same jobs with forced drafts at each acceptance.
	Forced []editForced `json:"forced"`
	// OutputsEqual: every run's replies equal the run without drafts,
	// token for token (checked; the bench fails otherwise).
	OutputsEqual bool        `json:"outputs_equal"`
	Load         loadAverage `json:"load_average"`
}

// editForced is one acceptance rate's figures.
type editForced struct {
	Acceptance      float64 `json:"acceptance"`
	TokS            float64 `json:"tok_s"`
	TokSNoDraft     float64 `json:"tok_s_no_draft"`
	TokSRatio       float64 `json:"tok_s_ratio"`
	AcceptedPerStep float64 `json:"accepted_per_step"`
	Drafted         int     `json:"drafted_tokens"`
	Accepted        int     `json:"accepted_tokens"`
}

// editTally adds up a run's decoding.
type editTally struct {
	tokens                 int // output tokens after each job's first
	decode                 time.Duration
	steps, drafted, accept int
}

func (t *editTally) add(m measured) {
	tm := m.Final.Timing
	if tm == nil || m.Tokens < 2 {
		return
	}
	t.tokens += m.Tokens - 1
	t.decode += tm.Decode
	if s := tm.Speculation; s != nil {
		t.steps, t.drafted, t.accept = t.steps+s.Steps, t.drafted+s.Drafted, t.accept+s.Accepted
	}
}

func (t editTally) tokS() float64 {
	if t.decode <= 0 {
		return 0
	}
	return float64(t.tokens) / t.decode.Seconds()
}

func (t editTally) acceptedPerStep() float64 {
	if t.steps == 0 {
		return 0
	}
	return float64(t.accept) / float64(t.steps)
}

// editJobs builds n edit jobs as K3 chats (thinking off): a passage of
// about words words and the request to rewrite it with a few words
// changed; each reply may run to output tokens.
func editJobs(tok *tokenizer.Tokenizer, n, words, output int, seed uint64) ([]workload.Job, error) {
	r := rand.New(rand.NewPCG(seed, 0x65646974))
	jobs := make([]workload.Job, n)
	for i := range jobs {
		passage := make([]string, words)
		for w := range passage {
			passage[w] = pick(r)
		}
		changes := make([]string, 3)
		for c := range changes {
			changes[c] = fmt.Sprintf("%q for %q", passage[r.IntN(words)], pick(r))
		}
		text := "Rewrite this passage, changing " + strings.Join(changes, ", ") + " and nothing else:\n\n" + strings.Join(passage, " ")
		ids, err := tok.EncodeChat(&tokenizer.Chat{ReasoningEffort: "none", Messages: []tokenizer.ChatMessage{tokenizer.Text("user", text)}})
		if err != nil {
			return nil, fmt.Errorf("--workload edit: job %d: %w", i, err)
		}
		j := workload.Job{ID: "edit-" + strconv.Itoa(i), Prompt: len(ids), Output: output, Tokens: make([]int32, len(ids))}
		for k, id := range ids {
			j.Tokens[k] = int32(id)
		}
		jobs[i] = j
	}
	return jobs, nil
}

// switchDrafter is a Drafter the bench swaps between runs.
type switchDrafter struct{ d atomic.Pointer[draft.Forced] }

func (s *switchDrafter) Draft(tokens []int32, k int) []int32 {
	if d := s.d.Load(); d != nil {
		return d.Draft(tokens, k)
	}
	return nil
}

// runEdit replays the edit workload: on a decode group with its lookup
// drafters (and no prefix cache, whose session index would draft each
// job's reply from its own earlier run), rounds without drafts (per
// request) and with them alternate; then, on a group drafting only
// forced drafts, each acceptance against its own rounds without drafts.
func (r *e2eBench) runEdit(ctx context.Context) (editOutput, error) {
	f := &r.cfg
	out := editOutput{Model: r.out.Model, Ranks: f.ranks, Jobs: len(r.jobs), Rounds: f.rounds, MedianPrompt: r.out.Workload.MedianPrompt,
		OutputTokens: f.editOutput, OutputsEqual: true}
	var want [][]int32 // the replies without drafts
	check := func(ms []measured, what string) error {
		for i, m := range ms {
			if m.Err != nil {
				return fmt.Errorf("e2e: %s: job %s: %w", what, m.Job.ID, m.Err)
			}
			if want == nil {
				continue
			}
			if !slices.Equal(m.Output, want[i]) {
				return fmt.Errorf("e2e: %s: job %s replied %d tokens that differ from its reply without drafts (%d tokens): drafting must not change a token", what, m.Job.ID, len(m.Output), len(want[i]))
			}
		}
		return nil
	}
	fail := func(err error) (editOutput, error) { return editOutput{}, err }
	run := func(noDraft bool, what string, t *editTally) error {
		opt := func(q *cp.SubmitRequest) { q.Sampling.NoDraft = noDraft }
		ms := make([]measured, len(r.jobs))
		for i, j := range r.jobs {
			r.runs++
			ms[i] = runJob(ctx, r.nc, j, time.Now(), cp.PolicyLocal, r.vocab, fmt.Sprintf("%s-%d", r.key, r.runs), f.jobTimeout, opt)
		}
		if err := check(ms, what); err != nil {
			return err
		}
		if want == nil {
			for _, m := range ms {
				want = append(want, m.Output)
			}
		}
		for _, m := range ms {
			t.add(m)
		}
		return nil
	}
	var off, on editTally
	for round := range f.rounds {
		say("e2e: edit round %d of %d: %d jobs without drafts, then with the lookup drafters", round+1, f.rounds, len(r.jobs))
		if err := run(true, "no drafts", &off); err != nil {
			return fail(err)
		}
		if err := run(false, "lookup drafts", &on); err != nil {
			return fail(err)
		}
	}
	out.TokSNoDraft, out.TokS, out.AcceptedPerStep = off.tokS(), on.tokS(), on.acceptedPerStep()
	out.Drafted, out.Accepted = on.drafted, on.accept
	if off.tokS() > 0 {
		out.TokSRatio = on.tokS() / off.tokS()
	}
	r.close()

	forced, err := r.runForced(ctx, want, run)
	if err != nil {
		return fail(err)
	}
	out.Forced = forced
	return out, nil
}

// runForced restarts the system with a group that drafts forced drafts
// only and runs each --forced-acceptance against rounds without drafts.
func (r *e2eBench) runForced(ctx context.Context, want [][]int32, run func(bool, string, *editTally) error) ([]editForced, error) {
	f := &r.cfg
	sw := &switchDrafter{}
	r.draftCfg = pipeline.DraftConfig{Drafter: sw}
	if err := r.startSystem(ctx); err != nil {
		return nil, err
	}
	var out []editForced
	for _, a := range f.forced {
		fd := &draft.Forced{Accept: a, Vocab: int32(r.vocab)}
		for i, j := range r.jobs {
			if err := fd.Add(j.Tokens, want[i]); err != nil {
				return nil, err
			}
		}
		sw.d.Store(fd)
		var off, on editTally
		for round := range f.rounds {
			say("e2e: forced drafts at acceptance %.2f, round %d of %d", a, round+1, f.rounds)
			if err := run(true, "no drafts", &off); err != nil {
				return nil, err
			}
			if err := run(false, fmt.Sprintf("forced drafts at %.2f", a), &on); err != nil {
				return nil, err
			}
		}
		x := editForced{Acceptance: a, TokS: on.tokS(), TokSNoDraft: off.tokS(), AcceptedPerStep: on.acceptedPerStep(), Drafted: on.drafted, Accepted: on.accept}
		if x.TokSNoDraft > 0 {
			x.TokSRatio = x.TokS / x.TokSNoDraft
		}
		out = append(out, x)
	}
	return out, nil
}

// writeEdit prints the edit workload's figures.
func (r *e2eBench) writeEdit(out editOutput, start time.Time, loadAll *loadSampler) error {
	say("e2e: edit workload, %d jobs of ~%d prompt tokens, up to %d output tokens, %d round(s), %s", out.Jobs, out.MedianPrompt, out.OutputTokens, out.Rounds, time.Since(start).Round(time.Second))
	fmt.Printf("%-22s %10s %10s %8s %16s\n", "drafts", "tok/s", "no drafts", "ratio", "accepted/step")
	fmt.Printf("%-22s %10.1f %10.1f %7.2fx %16.2f\n", "lookup", out.TokS, out.TokSNoDraft, out.TokSRatio, out.AcceptedPerStep)
	for _, x := range out.Forced {
		fmt.Printf("%-22s %10.1f %10.1f %7.2fx %16.2f\n", fmt.Sprintf("forced, acceptance %.2f", x.Acceptance), x.TokS, x.TokSNoDraft, x.TokSRatio, x.AcceptedPerStep)
	}
	if l, ok := loadAll.Stop(); ok {
		out.Load = l
		fmt.Printf("load average over the run: %.1f (%.1f to %.1f)\n", l.Mean, l.Min, l.Max)
	}
	if r.cfg.asJSON {
		return printJSON(out)
	}
	return nil
}
