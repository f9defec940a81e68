package conformance

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/mxfp"
)

// Tolerances of the composed checks.
const (
	// A layer is some twenty ops; their BF16 roundings add up in quadrature.
	tolLayer = 3e-2
	whyLayer = "a whole layer of BF16-input ops (about 20, errors add in quadrature)"
	// Logits pass every layer: the error of each compounds through the
	// residual stream, but stays well under the spread of the logits.
	tolLogits = 1e-1
	whyLogits = "every layer's BF16 rounding compounded through the residual stream"
	// nearTie is the top-2 logit margin (over the logits' RMS) under which a
	// different greedy id is explained by rounding, not a wrong kernel.
	nearTie = 0.05
	// minAgreement is the least top-1 agreement of greedy ids between the
	// disaggregated and the all-CPU paths (see disaggregated).
	minAgreement = 0.75
)

// modelChecks runs whole layers and the whole model on s.be against the CPU.
func (s *suite) modelChecks(ctx context.Context) error {
	ref, err := model.Load(s.opt.ModelDir, s.ref, model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		return fmt.Errorf("conformance: reference model: %w", err)
	}
	defer ref.Close()
	dev, err := model.Load(s.opt.ModelDir, s.be, model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		return fmt.Errorf("conformance: model on %s: %w", s.be.Name(), err)
	}
	defer dev.Close()
	defer func() {
		for _, l := range dev.Layers {
			if l != nil {
				for _, w := range l.Matrices() {
					s.be.Release(w)
				}
			}
		}
	}()
	cfg := ref.Cfg
	n := s.opt.Prompts
	if n == 0 {
		n = 16
		if s.opt.Short {
			n = 4
		}
	}
	g := s.gen("prompts")
	maxLen := 160
	if s.opt.Short {
		maxLen = 40
	}
	prompts := make([][]int32, n)
	for i := range prompts {
		p := make([]int32, 2+g.r.IntN(maxLen-1))
		for j := range p {
			p[j] = int32(g.r.IntN(cfg.VocabSize))
		}
		prompts[i] = p
	}
	if err := s.layerChecks(ctx, ref.Model, dev.Model, prompts); err != nil {
		return err
	}
	if err := s.logitChecks(ctx, ref.Model, dev.Model, prompts); err != nil {
		return err
	}
	if err := s.verifyRows(ctx, dev.Model, prompts); err != nil {
		return err
	}
	return s.disaggregated(ctx, ref.Model, dev.Model, prompts)
}

// layerChecks gives every layer the reference's input and state and
// compares its output and new state, per layer kind.
func (s *suite) layerChecks(ctx context.Context, ref, dev *model.Model, prompts [][]int32) error {
	cfg := ref.Cfg
	rs := make([]*model.SeqState, len(prompts))
	for i := range rs {
		rs[i] = ref.NewState(0, cfg.NumLayers)
	}
	rb, err := ref.NewBatch(rs, prompts)
	if err != nil {
		return err
	}
	type agg struct {
		r     Result
		pairs int
	}
	kinds := map[string]*agg{}
	var order []string
	for L := 0; L < cfg.NumLayers; L++ {
		// The backend's copy of the batch and the states before layer L.
		ds := make([]*model.SeqState, len(rs))
		for i, st := range rs {
			ds[i] = &model.SeqState{Layers: make([]*model.LayerState, cfg.NumLayers), Tokens: st.Tokens}
			ds[i].Layers[L] = st.Layers[L].Clone()
		}
		db := &model.Batch{Seqs: ds, Spans: rb.Spans, Partial: s.upload(rb.Partial)}
		for _, t := range rb.Stack {
			db.Stack = append(db.Stack, s.upload(t))
		}
		var dt time.Duration
		t0 := time.Now()
		if err := dev.RunLayer(ctx, dev.Layers[L], db, model.PhasePrefill); err != nil {
			return fmt.Errorf("conformance: layer %d on %s: %w", L, s.be.Name(), err)
		}
		got := s.get(db.Partial)
		dt = time.Since(t0)
		if err := ref.RunLayer(ctx, ref.Layers[L], rb, model.PhasePrefill); err != nil {
			return fmt.Errorf("conformance: layer %d on the reference: %w", L, err)
		}
		dev.FreeBatch(db)
		l := ref.Layers[L]
		kind := l.Kind.String()
		if l.Dense != nil {
			kind += "+dense"
		} else {
			kind += "+LatentMoE"
		}
		a := kinds[kind]
		if a == nil {
			a = &agg{r: Result{Name: "layer/" + kind, Tol: tolLayer, Why: whyLayer, Pass: true}}
			kinds[kind] = a
			order = append(order, kind)
		}
		a.pairs++
		a.r.Seconds += dt.Seconds()
		a.r.Shape = fmt.Sprintf("%d layers, %d rows, hidden %d", a.pairs, rb.Rows(), cfg.HiddenSize)
		check := func(want, got []float32, what string) {
			rel, mx := compare(want, got)
			if rel > a.r.Rel {
				a.r.Note = fmt.Sprintf("worst: layer %d %s", L, what)
			}
			a.r.Rel, a.r.Max = math.Max(a.r.Rel, rel), math.Max(a.r.Max, mx)
		}
		check(rb.Partial.Data, got, "output")
		for i := range rs {
			for pi := range rs[i].Layers[L].Parts {
				rp, dp := &rs[i].Layers[L].Parts[pi], &ds[i].Layers[L].Parts[pi]
				check(partValues(rp), partValues(dp), fmt.Sprintf("sequence %d %s", i, rp.Kind))
			}
		}
	}
	for _, k := range order {
		a := kinds[k]
		a.r.Pass = a.r.Rel <= a.r.Tol && a.r.Max <= maxFactor*a.r.Tol
		s.add(a.r)
	}
	return nil
}

// partValues reads a state part as float values.
func partValues(p *model.Part) []float32 {
	if p.DType == model.F32 {
		return p.F32()
	}
	u := p.U16()
	v := make([]float32, len(u))
	for i, x := range u {
		v[i] = mxfp.BF16ToF32(x)
	}
	return v
}

func (s *suite) upload(t *kernels.Tensor) *kernels.Tensor { return s.put(t.Rows, t.Cols, t.Data) }

// logitChecks prefills every prompt in one batch on both and compares the
// last-position logits and their greedy ids.
func (s *suite) logitChecks(ctx context.Context, ref, dev *model.Model, prompts [][]int32) error {
	cfg := ref.Cfg
	rs, ds := make([]*model.SeqState, len(prompts)), make([]*model.SeqState, len(prompts))
	for i := range rs {
		rs[i], ds[i] = ref.NewState(0, cfg.NumLayers), dev.NewState(0, cfg.NumLayers)
	}
	want, err := ref.Prefill(ctx, rs, prompts)
	if err != nil {
		return err
	}
	t0 := time.Now()
	got, err := dev.Prefill(ctx, ds, prompts)
	if err != nil {
		return fmt.Errorf("conformance: prefill on %s: %w", s.be.Name(), err)
	}
	dt := time.Since(t0)
	r := Result{Name: "model/logits", Shape: fmt.Sprintf("%d prompts in one batch, vocab %d", len(prompts), cfg.VocabSize), Tol: tolLogits, Why: whyLogits, Seconds: dt.Seconds()}
	same, ties := 0, 0
	for i := range want {
		rel, mx := compare(want[i], got[i])
		r.Rel, r.Max = math.Max(r.Rel, rel), math.Max(r.Max, mx)
		switch {
		case model.Argmax(want[i]) == model.Argmax(got[i]):
			same++
		case margin(want[i]) < nearTie:
			ties++
		}
	}
	r.Note = fmt.Sprintf("greedy ids equal %d/%d, near-ties %d", same, len(want), ties)
	r.Pass = r.Rel <= r.Tol && r.Max <= maxFactor*r.Tol && same+ties == len(want)
	s.add(r)
	return nil
}

// margin is the gap between the two largest logits over the logits' RMS.
func margin(v []float32) float64 {
	a, b := math.Inf(-1), math.Inf(-1)
	var ss float64
	for _, x := range v {
		f := float64(x)
		ss += f * f
		if f > a {
			a, b = f, a
		} else if f > b {
			b = f
		}
	}
	return (a - b) / math.Sqrt(ss/float64(len(v)))
}

// disaggregated prefills prompt[:-1] on the backend and lets the CPU
// continue (the decode group's first step and greedy steps after it), next
// to the all-CPU path (Model.Start and greedy decode steps), and reports the
// top-1 agreement of the greedy ids. A prompt's comparison ends at its first
// different id (the sequences have diverged). A different id is a near-tie
// when the all-CPU logits of the two ids differ by less than twice the
// largest logit difference between the paths at that step. Rounding alone
// also flips ids through the router: a token whose expert choice is a near
// tie takes another expert and its logits move far, so the check holds the
// agreement rate to minAgreement rather than every id (the CPU backend's own
// test demands all of them).
func (s *suite) disaggregated(ctx context.Context, ref, dev *model.Model, prompts [][]int32) error {
	const steps = 4
	cfg := ref.Cfg
	r := Result{Name: "model/disaggregated", Shape: fmt.Sprintf("%d prompts, %d greedy ids each", len(prompts), steps), Tol: 1 - minAgreement,
		Why: "prefill on the backend, decode on the CPU: greedy ids as the all-CPU path's; rel = 1 - top-1 agreement (router near-ties flip ids)", Pass: true}
	agree, total, ties := 0, 0, 0
	first := ""
	for _, p := range prompts {
		rs, rl, err := ref.Start(ctx, p)
		if err != nil {
			return err
		}
		ds := dev.NewState(0, cfg.NumLayers)
		t0 := time.Now()
		if len(p) > 1 {
			if err := dev.PrefillState(ctx, []*model.SeqState{ds}, [][]int32{p[:len(p)-1]}); err != nil {
				return fmt.Errorf("conformance: prefill on %s: %w", s.be.Name(), err)
			}
		}
		r.Seconds += time.Since(t0).Seconds()
		lg, err := ref.Decode(ctx, []*model.SeqState{ds}, p[len(p)-1:])
		if err != nil {
			return fmt.Errorf("conformance: the CPU continuing a state prefilled on %s: %w", s.be.Name(), err)
		}
		dl := lg[0]
		for j := 0; j < steps; j++ {
			a, b := model.Argmax(rl), model.Argmax(dl)
			total++
			if a != b {
				if gap, e := float64(rl[a]-rl[b]), maxDiff(rl, dl); gap < 2*e {
					ties++
				} else if first == "" {
					first = fmt.Sprintf("; first divergence not at a near-tie: prompt of %d tokens, step %d: id %d, all-CPU %d", len(p), j, b, a)
				}
				break
			}
			agree++
			if j == steps-1 {
				break
			}
			next := []int32{int32(a)}
			if lg, err = ref.Decode(ctx, []*model.SeqState{rs}, next); err != nil {
				return err
			}
			rl = lg[0]
			if lg, err = ref.Decode(ctx, []*model.SeqState{ds}, next); err != nil {
				return err
			}
			dl = lg[0]
		}
	}
	s.rep.Agreement = float64(agree) / float64(total)
	r.Rel = 1 - s.rep.Agreement
	r.Pass = s.rep.Agreement >= minAgreement
	r.Note = fmt.Sprintf("greedy agreement %d/%d, near-tie divergences %d%s", agree, total, ties, first)
	s.add(r)
	return nil
}

func maxDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}
