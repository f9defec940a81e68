package conformance

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/tandem-inference/tandem/model"
)

// verifyDrafts is how many drafted rows the verify check gives a sequence.
const verifyDrafts = 3

// verifyRows checks, on the backend alone, what exact speculative decoding
// relies on: a decode step in which a sequence takes its last token and k
// drafts gives each row the very bits that decoding the tokens one at a
// time gives, and committing all of them leaves the state those steps
// leave, byte for byte (model.Verify, model.Commit). The tolerance is 0:
// a backend whose ops depend on the rows beside a row (a GEMM that tiles
// differently by row count, a reduction split by batch) fails it, and its
// group must not draft.
func (s *suite) verifyRows(ctx context.Context, dev *model.Model, prompts [][]int32) error {
	cfg := dev.Cfg
	r := Result{Name: "model/verify_rows", Shape: fmt.Sprintf("%d prompts, 1+%d rows each", len(prompts), verifyDrafts),
		Why: "exact: each row of a decode step gets the bits it gets alone (speculative decoding's exactness)"}
	t0 := time.Now()
	same := 0
	for i, p := range prompts {
		base := dev.NewState(0, cfg.NumLayers)
		if len(p) > 1 {
			if err := dev.PrefillState(ctx, []*model.SeqState{base}, [][]int32{p[:len(p)-1]}); err != nil {
				return fmt.Errorf("conformance: prefill on %s: %w", s.be.Name(), err)
			}
		}
		toks := []int32{p[len(p)-1]}
		for j := range verifyDrafts {
			toks = append(toks, int32((int(p[0])+31*(i+j+1))%cfg.VocabSize))
		}
		one := base.Clone()
		var want [][]float32
		for _, t := range toks {
			l, err := dev.Decode(ctx, []*model.SeqState{one}, []int32{t})
			if err != nil {
				return fmt.Errorf("conformance: decode on %s: %w", s.be.Name(), err)
			}
			want = append(want, l[0])
		}
		ver := base.Clone()
		got, err := dev.Verify(ctx, []*model.SeqState{ver}, [][]int32{toks})
		if err == nil {
			err = dev.Commit(ver, len(toks))
		}
		if err != nil {
			return fmt.Errorf("conformance: verify step on %s: %w", s.be.Name(), err)
		}
		ok := true
		for k := range toks {
			rel, mx := compare(want[k], got[0][k])
			r.Rel, r.Max = math.Max(r.Rel, rel), math.Max(r.Max, mx)
			ok = ok && rel == 0 && mx == 0
		}
		a, errA := one.MarshalBinary()
		b, errB := ver.MarshalBinary()
		if ok && errA == nil && errB == nil && bytes.Equal(a, b) {
			same++
		}
	}
	r.Seconds = time.Since(t0).Seconds()
	r.Note = fmt.Sprintf("rows and committed states equal %d/%d", same, len(prompts))
	r.Pass = same == len(prompts)
	s.add(r)
	return nil
}
