package pipeline

import (
	"fmt"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/draft"
	"github.com/tandem-inference/tandem/decode-worker/mesh"
)

// Speculative decoding. The head drafts tokens for a sequence's next step
// (draft.Drafter over its prompt and output, then the session index of
// earlier sequences' tokens) and sends them with the step: the sequence
// takes 1+k rows, its last token and the k drafts. Every rank runs them as a
// verify span (model: logits bit-identical to decoding them one at a time,
// state pending until committed). The last rank verifies them with the
// sequence's sampler (sampling.Sampler.Verify: greedy or sampled, exactly as
// plain decoding draws), cuts the run at a stop token, the grammar's end or
// max_tokens, commits its own state and returns the accepted drafts with the
// token after them. The head commits its state when the result comes back;
// a rank in between commits when the sequence's next step arrives, whose
// position says how many tokens the head kept (planStep), or frees the
// state with the sequence's Release. How many to draft is the sequence's
// draft.Adaptive k at the group's measured cost per step rows (costCurve).

// DraftConfig sets up speculative decoding on the head.
type DraftConfig struct {
	// Off turns drafting off for the group.
	Off bool
	// KMax bounds the tokens drafted for a sequence per step (default 4,
	// at most MaxDraft).
	KMax int
	// Drafter replaces the lookup drafters (tests and the bench's forced
	// acceptance).
	Drafter draft.Drafter
	// Fixed drafts KMax tokens (or what the drafter has) every step,
	// whatever the acceptance and the cost (tests).
	Fixed bool
}

// Lookup settings: suffixes of 2 to 8 tokens, searched in the last 128k
// tokens of a sequence (a step's search stays well under a millisecond);
// the session index keeps about 256k tokens of earlier sequences (about
// 8 MB).
var (
	lookupDrafter = draft.PromptLookup{MinN: 2, MaxN: 8, Window: 1 << 17}
	sessionConfig = draft.SessionConfig{MinN: 2, MaxN: 8, MaxTokens: 1 << 18, PerKey: 8}
)

// Adaptive k: remember about ten verifications, stop under a 10% rate, try
// again after 16 steps.
const (
	adaptDecay = 0.9
	adaptFloor = 0.1
	adaptProbe = 16
)

// costCurve is the group's measured cost of a decode step by its rows: an
// exponentially weighted mean per row count.
type costCurve struct {
	mean []time.Duration // by rows; 0: not measured
}

const curveRows = 512

// observe records a step of rows rows that cost d.
func (c *costCurve) observe(rows int, d time.Duration) {
	if rows < 1 || rows >= curveRows || d <= 0 {
		return
	}
	if len(c.mean) <= rows {
		c.mean = append(c.mean, make([]time.Duration, rows+1-len(c.mean))...)
	}
	if m := c.mean[rows]; m > 0 {
		d = m + (d-m)/5
	}
	c.mean[rows] = d
}

// at is the cost of a step of rows rows: measured, or else the nearest
// measured row count below it (optimistic, so that an unmeasured size gets
// tried and measured); 0 when nothing below it was measured.
func (c *costCurve) at(rows int) time.Duration {
	for r := min(rows, len(c.mean)-1); r >= 1; r-- {
		if c.mean[r] > 0 {
			return c.mean[r]
		}
	}
	return 0
}

// draftBudget is how many tokens the head may draft for a sequence that
// emitted emitted of maxTokens: one step emits the accepted drafts and one
// token more, so at most maxTokens-emitted-1, and at most kMax.
func draftBudget(kMax, emitted, maxTokens int) int {
	return max(0, min(kMax, maxTokens-emitted-1))
}

// emitted is the tokens a result carries, in order: the accepted drafts
// then the token after them. It checks that the accepted ones are a prefix
// of the draft the head sent.
func emitted(accepted []int32, token int32, sent []int32) ([]int32, error) {
	if len(accepted) > len(sent) {
		return nil, fmt.Errorf("%d drafted tokens accepted of %d sent", len(accepted), len(sent))
	}
	for i, t := range accepted {
		if t != sent[i] {
			return nil, fmt.Errorf("accepted token %d is %d; the head drafted %d", i, t, sent[i])
		}
	}
	return append(append(make([]int32, 0, len(accepted)+1), accepted...), token), nil
}

// cutRun is where a verified run of tokens ends: the index of the first
// token that ends the sequence (a stop token, the grammar's end at index
// ended (-1: none), or the generated+i+1'th token reaching maxTokens), or
// -1 when the whole run goes on, with why.
func cutRun(run []int32, stop map[int32]bool, ended, generated, maxTokens int) (int, Reason) {
	for i, t := range run {
		if why := sampledEnd(stop[t], i == ended, generated+i+1, maxTokens); why != "" {
			return i, why
		}
	}
	return -1, ""
}

// verifyDraw is the last rank's verification of a sequence's drafts d
// against its rows' logits (row i: after d[:i]): the run it emits, the
// accepted drafts then the next token, cut where the sequence ends, goes
// into r; the rank's own state keeps the rows of the accepted drafts. With
// a grammar, each row's mask is the matcher's after the drafts before it
// (a draft the mask forbids is never accepted), and the matcher takes the
// emitted tokens.
func (w *Worker) verifyDraw(s *seq, r *mesh.Result, rows [][]float32, d []int32) {
	fail := func(err error) {
		r.Done, r.Reason, r.Err = true, string(ReasonError), fmt.Sprintf("decode rank %d: %v", w.cfg.Rank, err)
	}
	var t0 time.Time
	ended := -1 // the index in the run of the token that ended the grammar's reply
	var merr error
	var mask func(i int) []uint64
	if s.matcher != nil {
		t0 = w.now()
		mask = func(i int) []uint64 {
			if i > 0 && ended < 0 && merr == nil {
				if merr = s.matcher.Accept(int(d[i-1])); merr == nil && s.matcher.Ended() {
					ended = i - 1
				}
			}
			if ended >= 0 || merr != nil {
				return nil // the run ends before this row: its draw is thrown away
			}
			if merr = s.matcher.Mask(s.mask); merr != nil {
				return nil
			}
			return s.mask
		}
	}
	acc, next, err := s.sampler.Verify(rows, d, mask)
	if err == nil && merr == nil && s.matcher != nil && ended < 0 {
		if merr = s.matcher.Accept(int(next)); merr == nil && s.matcher.Ended() {
			ended = acc
		}
	}
	if err == nil {
		err = merr
	}
	if err == nil && s.e.State.Pending() > 0 {
		err = w.m.Commit(s.e.State, 1+acc)
	}
	if err != nil {
		fail(err)
		return
	}
	run := append(d[:acc:acc], next)
	cut, why := cutRun(run, s.stop, ended, s.generated, s.admit.MaxTokens)
	if cut >= 0 {
		run = run[:cut+1]
		r.Done, r.Reason = true, string(why)
	}
	if s.matcher != nil {
		w.grammarDraws.Add(int64(len(run)))
		w.grammarNanos.Add(int64(w.now().Sub(t0)))
	}
	s.generated += len(run)
	r.Accepted, r.Token = run[:len(run)-1], run[len(run)-1]
}

// drafting reports whether the head drafts for s: the group drafts and the
// request did not turn it off.
func (w *Worker) drafting(s *seq) bool {
	return !w.cfg.Draft.Off && !s.req.NoDraft
}

// drafter is the head's drafter: the configured one, or prompt lookup then
// the session index of earlier sequences (when the prefix cache is on).
func (w *Worker) drafter() draft.Drafter {
	if d := w.cfg.Draft.Drafter; d != nil {
		return d
	}
	if w.session != nil && !w.cacheOff {
		return draft.First{lookupDrafter, w.session}
	}
	return lookupDrafter
}

// planDrafts drafts the next tokens of each sequence of a decode step
// (drafts[i] for ss[i], nil where none) and keeps them in the sequences
// until their results come back. Each sequence's k is its Adaptive plan at
// the group's cost of a step with the rows planned so far and its own.
func (w *Worker) planDrafts(ss []*seq) [][]int32 {
	out := make([][]int32, len(ss))
	dc := w.cfg.Draft
	extra := 0
	for i, s := range ss {
		s.draft = nil
		if !w.drafting(s) || s.hist == nil {
			continue
		}
		k := draftBudget(dc.KMax, s.emitted, s.req.MaxTokens)
		if !dc.Fixed && k > 0 {
			if s.adapt == nil {
				s.adapt = draft.NewAdaptive(dc.KMax, adaptDecay, adaptFloor, adaptProbe)
			}
			base := len(ss) + extra
			k = min(k, s.adapt.Plan(func(r int) time.Duration { return w.curve.at(base + r - 1) }))
		}
		var d []int32
		if k > 0 {
			d = w.drafter().Draft(s.hist, k)
		}
		d = d[:min(len(d), k)] // a drafter that ignores k
		if bad := slices.IndexFunc(d, func(t int32) bool { return t < 0 || int(t) >= w.m.Cfg.VocabSize }); bad >= 0 {
			d = d[:bad] // never an id the embedding refuses
		}
		if len(d) == 0 && s.adapt != nil {
			s.adapt.Observe(0, 0) // counts toward trying again
		}
		s.draft, out[i] = d, d
		extra += len(d)
	}
	return out
}

// verified takes a decode result on the head: the tokens it emits (the
// accepted drafts, checked against what the head sent, then the token
// after them); the head's own state keeps the rows of the accepted drafts;
// the counts and the sequence's k learn from it.
func (w *Worker) verified(s *seq, r mesh.Result) ([]int32, error) {
	sent := s.draft
	s.draft = nil
	run, err := emitted(r.Accepted, r.Token, sent)
	if err != nil {
		return nil, fmt.Errorf("decode group: sequence %q: %w", s.id, err)
	}
	if st := s.e.State; st.Pending() > 0 {
		if err := w.m.Commit(st, min(len(run), st.Pending())); err != nil {
			return nil, fmt.Errorf("decode rank 0: %w", err)
		}
	}
	s.steps++
	if a := len(r.Accepted); len(sent) > 0 {
		c := &w.counters
		c.drafted += int64(len(sent))
		c.accepted += int64(a)
		c.verifies++
		if len(c.acceptedRuns) <= a {
			c.acceptedRuns = append(c.acceptedRuns, make([]int64, a+1-len(c.acceptedRuns))...)
		}
		c.acceptedRuns[a]++
		s.drafted += len(sent)
		s.accepted += a
		if s.adapt != nil && !r.Done {
			s.adapt.Observe(len(sent), a)
		}
	}
	if s.hist != nil {
		s.hist = append(s.hist, run...)
	}
	return run, nil
}

// remember gives a sequence that ended well to the session index, for
// later sequences to draft from.
func (w *Worker) remember(s *seq) {
	if w.session != nil && s.hist != nil {
		w.sessionID++
		w.session.Add(w.sessionID, s.hist)
	}
}
