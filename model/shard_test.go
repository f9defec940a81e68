package model_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/tandem-inference/tandem/decode-worker/collective"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
)

// Tolerance of a split layer against the unsplit one. The split changes
// only the order of the sums it cuts (o_proj's and down_proj's dot
// products, the experts' mixture), each rank's part rounded to fp32 before
// the rank-order sum: a few fp32 ulps of the layer's outputs, which are of
// order 1-10 on the synthetic presets.
const shardAbs, shardRel = 2e-5, 2e-5

// shardCase is a preset and the tensor sizes that divide its heads.
var shardCases = []struct {
	preset string
	ranks  []int
}{{"tiny", []int{2}}, {"small", []int{2, 3}}}

// stage is the T ranks of one split stage, in one process.
type stage []*model.Model

func newStage(t *testing.T, m *model.Model, T int) stage {
	t.Helper()
	red := model.LocalReducers(T)
	st := make(stage, T)
	for r := range st {
		s, err := m.ShardOf(model.Shard{Rank: r, Ranks: T}, red[r])
		if err != nil {
			t.Fatal(err)
		}
		st[r] = s
	}
	return st
}

// each runs fn on every rank at once (the reductions need them all) and
// returns the first error; a rank that fails leaves its group.
func (st stage) each(fn func(r int, m *model.Model) error) error {
	errs := make([]error, len(st))
	var wg sync.WaitGroup
	for r, m := range st {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = fn(r, m); errs[r] != nil {
				m.Reduce.(*model.LocalReducer).Close()
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

func cloneTensor(be kernels.Backend, t *kernels.Tensor) *kernels.Tensor {
	out := be.NewTensor(t.Rows, t.Cols)
	copy(out.Data, t.Data)
	return out
}

func cloneBatch(be kernels.Backend, b *model.Batch, seqs []*model.SeqState) *model.Batch {
	out := &model.Batch{Seqs: seqs, Spans: slices.Clone(b.Spans), Partial: cloneTensor(be, b.Partial)}
	for _, s := range b.Stack {
		out.Stack = append(out.Stack, cloneTensor(be, s))
	}
	return out
}

func closeTo(what string, got, want []float32) (float64, error) {
	if len(got) != len(want) {
		return 0, fmt.Errorf("%s: %d values, want %d", what, len(got), len(want))
	}
	var worst float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		worst = max(worst, d)
		if !(d <= shardAbs+shardRel*math.Abs(float64(want[i]))) {
			return worst, fmt.Errorf("%s: element %d = %g, want %g", what, i, got[i], want[i])
		}
	}
	return worst, nil
}

// TestShardLayersMatchUnsplit: each layer split over T ranks (KDA, MLA,
// dense FFN, LatentMoE), reduced in rank order, gives the unsplit layer's
// output on every rank with identical bits, and leaves each rank the slice
// of the unsplit KDA state that it owns, in prefill and in decode.
func TestShardLayersMatchUnsplit(t *testing.T) {
	for _, tc := range shardCases {
		m := loadModel(t, tc.preset, 1, model.F32)
		for _, T := range tc.ranks {
			t.Run(fmt.Sprintf("%s/tensor%d", tc.preset, T), func(t *testing.T) {
				checkShardLayers(t, m.Model, newStage(t, m.Model, T))
			})
		}
	}
}

func checkShardLayers(t *testing.T, m *model.Model, st stage) {
	ctx, c, be := context.Background(), m.Cfg, m.Backend
	full := []*model.SeqState{m.NewState(0, c.NumLayers), m.NewState(0, c.NumLayers)}
	steps := []struct {
		phase  model.Phase
		tokens [][]int32
	}{
		{model.PhasePrefill, [][]int32{testkit.Prompt(7, c.VocabSize, 1), testkit.Prompt(11, c.VocabSize, 2)}},
		{model.PhaseDecode, [][]int32{{3}, {5}}},
	}
	var worst float64
	for _, step := range steps {
		// Each rank's states are the slices of the unsplit states so far.
		seqs := make([][]*model.SeqState, len(st))
		for r := range st {
			for _, s := range full {
				sl, err := c.ShardSeqState(s, st[r].Shard)
				if err != nil {
					t.Fatal(err)
				}
				seqs[r] = append(seqs[r], sl)
			}
		}
		b, err := m.NewBatch(full, step.tokens)
		if err != nil {
			t.Fatal(err)
		}
		for L := 0; L < c.NumLayers; L++ {
			in := make([]*model.Batch, len(st))
			for r := range st {
				in[r] = cloneBatch(be, b, seqs[r])
			}
			if err := m.RunLayer(ctx, m.Layers[L], b, step.phase); err != nil {
				t.Fatal(err)
			}
			if err := st.each(func(r int, sm *model.Model) error {
				return sm.RunLayer(ctx, sm.Layers[L], in[r], step.phase)
			}); err != nil {
				t.Fatal(err)
			}
			what := fmt.Sprintf("phase %d layer %d (%s)", step.phase, L, c.LayerKind(L))
			for r := range st {
				if !slices.Equal(in[r].Partial.Data, in[0].Partial.Data) {
					t.Fatalf("%s: rank %d's output differs from rank 0's", what, r)
				}
				d, err := closeTo(what, in[r].Partial.Data, b.Partial.Data)
				if err != nil {
					t.Fatal(err)
				}
				worst = max(worst, d)
				if len(in[r].Stack) != len(b.Stack) {
					t.Fatalf("%s: rank %d has %d blocks, want %d", what, r, len(in[r].Stack), len(b.Stack))
				}
				for i, s := range full {
					want, err := c.ShardLayerState(s.Layers[L], st[r].Shard)
					if err != nil {
						t.Fatal(err)
					}
					for j := range want.Parts {
						got := seqs[r][i].Layers[L].Parts[j]
						if _, err := closeTo(fmt.Sprintf("%s rank %d seq %d %s", what, r, i, got.Kind), partValues(&got), partValues(&want.Parts[j])); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
		b.Advance()
		m.FreeBatch(b)
	}
	t.Logf("largest difference from the unsplit layers: %.3g", worst)
}

// partValues widens a state part to fp32 values.
func partValues(p *model.Part) []float32 {
	if f := p.F32(); f != nil {
		return f
	}
	out := make([]float32, 0, len(p.U16()))
	for _, u := range p.U16() {
		out = append(out, math.Float32frombits(uint32(u)<<16))
	}
	return out
}

// TestShardModelGreedyEqualsUnsplit: the whole model split over T ranks
// in one process generates the unsplit model's greedy ids on several
// prompts; every rank gets the same logits bit for bit, and a second run
// repeats them bit for bit.
func TestShardModelGreedyEqualsUnsplit(t *testing.T) {
	ctx := context.Background()
	for _, tc := range shardCases {
		m := loadModel(t, tc.preset, 1, model.BF16)
		for _, T := range tc.ranks {
			t.Run(fmt.Sprintf("%s/tensor%d", tc.preset, T), func(t *testing.T) {
				st := newStage(t, m.Model, T)
				for seed := 1; seed <= 2; seed++ {
					prompt := testkit.Prompt(5+4*seed, m.Cfg.VocabSize, seed)
					want, err := m.Generate(ctx, prompt, 5)
					if err != nil {
						t.Fatal(err)
					}
					runs := make([][][]float32, 3-seed) // the first prompt runs twice
					for run := range runs {
						got := make([][]int32, T)
						logits := make([][]float32, T)
						if err := st.each(func(r int, sm *model.Model) error {
							var err error
							got[r], logits[r], err = generateLast(ctx, sm, prompt, 5)
							return err
						}); err != nil {
							t.Fatal(err)
						}
						for r := range got {
							if !slices.Equal(got[r], want) {
								t.Fatalf("prompt %d: tensor %d rank %d generated %v, unsplit %v", seed, T, r, got[r], want)
							}
							if !slices.Equal(logits[r], logits[0]) {
								t.Fatalf("prompt %d: rank %d's logits differ from rank 0's", seed, r)
							}
						}
						runs[run] = logits
					}
					if len(runs) > 1 && !slices.Equal(runs[0][0], runs[1][0]) {
						t.Fatalf("prompt %d: a second run's logits differ", seed)
					}
				}
			})
		}
	}
}

// generateLast is Model.Generate that also returns the last step's logits.
func generateLast(ctx context.Context, m *model.Model, prompt []int32, n int) ([]int32, []float32, error) {
	s, logits, err := m.Start(ctx, prompt)
	if err != nil {
		return nil, nil, err
	}
	var out []int32
	for {
		out = append(out, int32(model.Argmax(logits)))
		if len(out) == n {
			return out, logits, nil
		}
		l, err := m.Decode(ctx, []*model.SeqState{s}, out[len(out)-1:])
		if err != nil {
			return nil, nil, err
		}
		logits = l[0]
	}
}

// TestShardLoadBindsOnlyItsSlices: ranks loaded from the checkpoint with
// LoadOptions.Shard hold only their experts, heads and vocabulary range,
// and together generate the unsplit model's ids.
func TestShardLoadBindsOnlyItsSlices(t *testing.T) {
	ctx := context.Background()
	whole := loadModel(t, "tiny", 1, model.BF16)
	dir := testmodel.Dir(t, "tiny", 1, 1)
	const T = 2
	red := model.LocalReducers(T)
	st := make(stage, T)
	for r := range st {
		ld, err := model.Load(dir, cpu.New(1), model.LoadOptions{Embed: true, Head: true, Shard: model.Shard{Rank: r, Ranks: T}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ld.Close() })
		ld.Reduce = red[r]
		st[r] = ld.Model
		c := ld.Cfg
		for _, l := range ld.Layers {
			if l.MoE != nil && (len(l.MoE.Experts) != c.NumExperts/T || l.MoE.ExpertBase != r*c.NumExperts/T) {
				t.Fatalf("rank %d layer %d holds experts [%d, +%d)", r, l.Index, l.MoE.ExpertBase, len(l.MoE.Experts))
			}
			if l.KDA != nil && l.KDA.BProj.Rows != c.KDAHeads/T {
				t.Fatalf("rank %d layer %d holds %d KDA heads", r, l.Index, l.KDA.BProj.Rows)
			}
		}
		if ld.Globals.LMHead.Rows != c.VocabSize/T || ld.Globals.VocabBase != r*c.VocabSize/T {
			t.Fatalf("rank %d holds lm_head rows [%d, +%d)", r, ld.Globals.VocabBase, ld.Globals.LMHead.Rows)
		}
	}
	prompt := testkit.Prompt(9, whole.Cfg.VocabSize, 4)
	want, err := whole.Generate(ctx, prompt, 6)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.each(func(r int, m *model.Model) error {
		got, err := m.Generate(ctx, prompt, 6)
		if err == nil && !slices.Equal(got, want) {
			err = fmt.Errorf("generated %v, unsplit %v", got, want)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestShardRankGoneFailsTheStep: when one rank of a stage stops (its ctx
// ends before it reduces), the other ranks' step fails with an error
// instead of waiting for it.
func TestShardRankGoneFailsTheStep(t *testing.T) {
	m := loadModel(t, "tiny", 1, model.BF16)
	st := newStage(t, m.Model, 2)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	err := st.each(func(r int, sm *model.Model) error {
		ctx := context.Background()
		if r == 1 {
			ctx = gone
		}
		_, err := sm.Decode(ctx, []*model.SeqState{sm.NewState(0, sm.Cfg.NumLayers)}, []int32{7})
		return err
	})
	if err == nil {
		t.Fatal("a step with a rank gone succeeded")
	}
	t.Logf("error: %v", err)
}

// TestShardGreedyGathersCandidates: Greedy on the ranks of a split stage,
// which exchange only (value, index) per rank, picks the unsplit logits'
// argmax for every sequence of a batch.
func TestShardGreedyGathersCandidates(t *testing.T) {
	ctx := context.Background()
	m := loadModel(t, "small", 1, model.BF16)
	st := newStage(t, m.Model, 3)
	prompts := [][]int32{testkit.Prompt(6, m.Cfg.VocabSize, 1), testkit.Prompt(3, m.Cfg.VocabSize, 2), testkit.Prompt(9, m.Cfg.VocabSize, 3)}
	var want []int32
	seqs := []*model.SeqState{m.NewState(0, m.Cfg.NumLayers), m.NewState(0, m.Cfg.NumLayers), m.NewState(0, m.Cfg.NumLayers)}
	logits, err := m.Prefill(ctx, seqs, prompts)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range logits {
		want = append(want, int32(model.Argmax(l)))
	}
	if err := st.each(func(r int, sm *model.Model) error {
		seqs := []*model.SeqState{sm.NewState(0, sm.Cfg.NumLayers), sm.NewState(0, sm.Cfg.NumLayers), sm.NewState(0, sm.Cfg.NumLayers)}
		b, err := sm.NewBatch(seqs, prompts)
		if err != nil {
			return err
		}
		defer sm.FreeBatch(b)
		if err := sm.ForwardLayers(ctx, 0, sm.Cfg.NumLayers, b, model.PhasePrefill); err != nil {
			return err
		}
		got, err := sm.Greedy(ctx, b)
		if err == nil && !slices.Equal(got, want) {
			err = fmt.Errorf("greedy %v, unsplit argmax %v", got, want)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// dyingReducer is a rank that dies in its n-th reduction: it closes its
// links (as a process's end closes its sockets) instead of sending.
type dyingReducer struct {
	g    *collective.Group
	left int
}

func (d *dyingReducer) AllReduce(ctx context.Context, buf []float32) error {
	if d.left--; d.left < 0 {
		d.g.Close()
		return errors.New("rank died")
	}
	return d.g.AllReduce(ctx, buf)
}

// TestShardRankDiesMidReduction: two ranks of a split stage reduce over
// the collective on loopback TCP; when rank 1 dies in the middle of a
// decode step, rank 0's step fails with the collective's error naming the
// peer, at once, instead of waiting for it.
func TestShardRankDiesMidReduction(t *testing.T) {
	m := loadModel(t, "tiny", 1, model.BF16)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	var gs [2]*collective.Group
	for r, c := range []net.Conn{dialed, accepted} {
		links := make([]collective.Link, 2)
		links[1-r] = collective.NewStreamLink(c)
		if gs[r], err = collective.New(collective.Config{Rank: r, Ranks: 2, Links: links}); err != nil {
			t.Fatal(err)
		}
		defer gs[r].Close()
	}
	ranks := make(stage, 2)
	for r, red := range []model.Reducer{gs[0], &dyingReducer{g: gs[1], left: 7}} {
		if ranks[r], err = m.ShardOf(model.Shard{Rank: r, Ranks: 2}, red); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, sm := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[r] = sm.Decode(testctx.Context(t), []*model.SeqState{sm.NewState(0, sm.Cfg.NumLayers)}, []int32{7})
		}()
	}
	wg.Wait()
	var pe *collective.PeerError
	if !errors.As(errs[0], &pe) || pe.Peer != 1 {
		t.Fatalf("rank 0: %v, want the collective's error about rank 1", errs[0])
	}
	t.Logf("rank 0: %v", errs[0])
}
