package pipeline

import (
	"fmt"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/mesh"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// The step core: what a rank does with a step and what the head does with
// its results, as pure functions of the rank's view, the message and the
// outcome of the compute. onStep, sample (stage.go) and onResults
// (head.go) are the loop around them, which computes and sends;
// step_test.go checks each rule without a ring, a model or a clock.

// rankView is what the step rules need to know of a rank.
type rankView struct {
	rank  int
	lo    int  // its first layer
	cols  int  // the width of the activations it takes
	stack int  // the completed blocks its first layer takes
	last  bool // it samples
}

// seqView is a rank's view of one sequence of a step; the zero value is
// a sequence it does not hold.
type seqView struct {
	held      bool // it holds the sequence's state
	tokens    int  // the tokens in that state
	pending   int  // rows of an uncommitted verify step in it (model.SeqState.Pending)
	cancelled bool // being cancelled: it leaves the step before it runs
}

// stepPlan is what a rank does with a step that came in: fail it when err
// is set; otherwise compute the rows of the sequences in run and drop the
// rows in skip (sequences being cancelled).
type stepPlan struct {
	err   error
	run   []int          // indices into the step's sequences, in order
	spans []kernels.Span // the rows of run's sequences in the payload
	skip  []kernels.Span // the rows of the skipped sequences
	rows  int            // the payload's rows
	// commit[k] is how many rows of run[k]'s pending verify step to
	// commit before the step runs (0: none pending): the step's position
	// says how many tokens the head kept of it.
	commit []int
	// drafts[k] are run[k]'s drafted tokens (after its last token).
	drafts [][]int32
}

// MaxDraft bounds the drafted tokens of one sequence in one step.
const MaxDraft = 16

// planStep checks a step against the rank and its sequences (seqs, by id)
// and plans its rows. A step of an unknown phase, of inconsistent shape,
// of activations the rank's layers do not take, or for a sequence the rank
// does not hold at the step's position fails whole.
func planStep(v rankView, st *mesh.Step, seqs map[string]seqView) stepPlan {
	fail := func(format string, a ...any) stepPlan { return stepPlan{err: fmt.Errorf(format, a...)} }
	phase := model.Phase(st.Phase)
	switch {
	case phase != model.PhasePrefill && phase != model.PhaseDecode:
		return fail("unknown phase %d", st.Phase)
	case len(st.Seqs) == 0 || len(st.Pos) != len(st.Seqs) || len(st.Rows) != len(st.Seqs):
		return fail("%d sequences with %d positions and %d row counts", len(st.Seqs), len(st.Pos), len(st.Rows))
	case st.Cols != v.cols || st.Stack != v.stack:
		return fail("activations of width %d with %d blocks; layer %d takes width %d with %d", st.Cols, st.Stack, v.lo, v.cols, v.stack)
	}
	p := stepPlan{run: make([]int, 0, len(st.Seqs)), spans: make([]kernels.Span, 0, len(st.Seqs))}
	drafted := 0
	for i, id := range st.Seqs {
		n := int(st.Rows[i])
		s := seqs[id]
		d := 0
		if phase == model.PhaseDecode {
			d = n - 1
		}
		switch {
		case n < 1 || phase == model.PhaseDecode && n > 1+MaxDraft:
			return fail("sequence %q has %d rows in a %s step", id, st.Rows[i], phaseName(phase))
		case drafted+d > len(st.Draft):
			return fail("sequence %q has %d drafted rows; the step carries %d drafts for them all", id, d, len(st.Draft))
		case s.cancelled:
			p.skip = append(p.skip, kernels.Span{Lo: p.rows, Hi: p.rows + n})
			p.rows += n
			drafted += d
			continue
		case !s.held:
			return fail("sequence %q has no state on this rank", id)
		}
		commit := 0
		if at := int(st.Pos[i]); s.pending > 0 {
			commit = at - s.tokens
			if commit < 1 || commit > s.pending {
				return fail("sequence %q is at token %d here with a verify step of %d rows pending; the step is for token %d", id, s.tokens, s.pending, at)
			}
		} else if at != s.tokens {
			return fail("sequence %q is at token %d here, the step is for token %d", id, s.tokens, at)
		}
		p.run = append(p.run, i)
		p.spans = append(p.spans, kernels.Span{Lo: p.rows, Hi: p.rows + n})
		p.commit = append(p.commit, commit)
		p.drafts = append(p.drafts, st.Draft[drafted:drafted+d:drafted+d])
		p.rows += n
		drafted += d
	}
	if drafted != len(st.Draft) {
		return fail("the step carries %d drafts, its sequences %d", len(st.Draft), drafted)
	}
	return p
}

// failStep is the report of a step the rank could not run, for the head:
// every sequence of the step ends with the error, which names the rank and
// the step (and is returned for the log).
func failStep(rank int, epoch uint64, st *mesh.Step, tr mesh.Trace, err error) (*mesh.Header, error) {
	err = fmt.Errorf("decode rank %d: step %d: %w", rank, st.ID, err)
	res := make([]mesh.Result, len(st.Seqs))
	for i, id := range st.Seqs {
		res[i] = mesh.Result{Seq: id, Done: true, Reason: string(ReasonError), Err: err.Error()}
	}
	return &mesh.Header{Kind: mesh.KindTokens, Epoch: epoch, Tokens: &mesh.Tokens{Step: st.ID, Results: res, Trace: tr}}, err
}

// merged lays a step's computed rows (spans, of the sequences run) and
// skipped rows out in payload order: from[k] is the index into spans of
// all[k], or -1 for a skipped span.
func merged(spans, skip []kernels.Span) (all []kernels.Span, from []int) {
	for i, j := 0, 0; i < len(spans) || j < len(skip); {
		if j < len(skip) && (i == len(spans) || skip[j].Lo < spans[i].Lo) {
			all, from = append(all, skip[j]), append(from, -1)
			j++
			continue
		}
		all, from = append(all, spans[i]), append(from, i)
		i++
	}
	return all, from
}

// kept is xs without the elements whose keep is false: the sequences a
// step dropped as it ran (torn: never stepped again) go no further.
func kept[T any](xs []T, keep []bool) []T {
	out := xs[:0:0]
	for i, x := range xs {
		if keep[i] {
			out = append(out, x)
		}
	}
	return out
}

// stepNext is the message a rank sends once it computed a step, of which
// the sequences named in still are left (in the step's order), with stack
// completed blocks: with none left, an empty Tokens (the head ended them
// as cancelled); from the last rank, the results back to the head;
// otherwise the step, of the sequences left, to the next rank.
func stepNext(v rankView, epoch uint64, st *mesh.Step, tr mesh.Trace, still []string, stack int, results []mesh.Result) *mesh.Header {
	switch {
	case len(still) == 0:
		return &mesh.Header{Kind: mesh.KindTokens, Epoch: epoch, Tokens: &mesh.Tokens{Step: st.ID, Trace: tr}}
	case v.last:
		return &mesh.Header{Kind: mesh.KindTokens, Epoch: epoch, Tokens: &mesh.Tokens{Step: st.ID, Results: results, Trace: tr}}
	}
	next := *st
	next.Stack, next.Trace = stack, tr
	if len(still) < len(st.Seqs) {
		left := make(map[string]bool, len(still))
		for _, id := range still {
			left[id] = true
		}
		next.Seqs, next.Pos, next.Rows, next.Draft = nil, nil, nil, nil
		off := 0
		for i, id := range st.Seqs {
			d := 0
			if model.Phase(st.Phase) == model.PhaseDecode {
				d = int(st.Rows[i]) - 1
			}
			if left[id] {
				next.Seqs, next.Pos, next.Rows = append(next.Seqs, id), append(next.Pos, st.Pos[i]), append(next.Rows, st.Rows[i])
				next.Draft = append(next.Draft, st.Draft[off:off+d]...)
			}
			off += d
		}
	}
	return &mesh.Header{Kind: mesh.KindStep, Epoch: epoch, Step: &next}
}

// sampledEnd is why a sequence ends with the token it drew ("": it goes
// on): a stop token or the end of its grammar's reply, else its token
// limit, with generated tokens drawn.
func sampledEnd(stop, ended bool, generated, maxTokens int) Reason {
	switch {
	case stop || ended:
		return ReasonStop
	case generated >= maxTokens:
		return ReasonLength
	}
	return ""
}

// freeOnLast reports whether the last rank frees a sequence its result
// ended at once: unless it leaves a cache entry (pend) and ended well, it
// waits for the head's Release, as every other rank does, so that all
// keep the entry at the same point of the ring's order.
func freeOnLast(r mesh.Result, pend bool) bool {
	return r.Done && (!pend || r.Reason == string(ReasonError))
}

// resultAction is what the head does with one result of a step.
type resultAction int

const (
	resultIgnore resultAction = iota // ended meanwhile, or no token to take
	resultFail                       // a rank's error ends the sequence
	resultToken                      // a token; the sequence goes on
	resultEnd                        // a token that ends the sequence
)

// onResult is the head's rule for a result of a step of phase: live says
// the sequence is still the one the step ran; inflight that its decode step
// is still awaited.
func onResult(r mesh.Result, phase model.Phase, live, inflight bool) resultAction {
	switch {
	case !live:
		return resultIgnore
	case r.Done && r.Reason == string(ReasonError):
		return resultFail
	case phase != model.PhaseDecode || !inflight:
		return resultIgnore
	case r.Done:
		return resultEnd
	}
	return resultToken
}

// hopTime is a message's time in transit, by the sender's clock reading
// sentAt (unix nanoseconds; 0: not stamped) and the receiver's at.
func hopTime(sentAt int64, at time.Time) int64 {
	if sentAt <= 0 {
		return 0
	}
	return max(at.UnixNano()-sentAt, 0)
}
