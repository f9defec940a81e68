package model

import (
	"context"
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
)

// Model is a holder of K3 weights on a backend: the whole model, or a layer
// range (a decode rank), or nothing resident at all (the prefill worker, which
// binds each streamed layer and runs it with RunLayer).
type Model struct {
	Cfg     *Config
	Backend kernels.Backend
	// Globals holds the embedding, final mix, norm and lm_head; nil on a
	// holder that needs none of them.
	Globals *Globals
	// Layers[L] is resident layer L, or nil.
	Layers []*Layer
	// State chooses how new sequence states are stored.
	State StateOptions
	// Shard is the tensor-parallel rank this holder is of its stage (the
	// zero Shard: the unsplit model); its layers hold that rank's slices
	// (shard.go), and Reduce sums the partial outputs over the stage.
	Shard  Shard
	Reduce Reducer
}

// New returns a model holder with no weights bound.
func New(c *Config, be kernels.Backend) *Model {
	return &Model{Cfg: c, Backend: be, Layers: make([]*Layer, c.NumLayers),
		State: StateOptions{LatentDType: BF16}}
}

// NewState returns an empty sequence state for layers [lo, hi).
func (m *Model) NewState(lo, hi int) *SeqState { return m.Cfg.NewSeqState(lo, hi, m.State) }

// RunLayer applies layer l (resident or just streamed in) to the batch. Every
// sequence must hold a state for the layer.
func (m *Model) RunLayer(ctx context.Context, l *Layer, b *Batch, phase Phase) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	L := l.Index
	for i, s := range b.Seqs {
		if L >= len(s.Layers) || s.Layers[L] == nil {
			return fmt.Errorf("model: sequence %d has no state for layer %d", i, L)
		}
	}
	if want := m.Cfg.StackLenBefore(L); len(b.Stack) != want {
		return fmt.Errorf("model: layer %d expects %d AttnRes blocks in the stack, batch has %d", L, want, len(b.Stack))
	}
	if err := checkVerify(L, b, phase); err != nil {
		return err
	}
	return m.forwardLayer(ctx, l, b, phase)
}

// ForwardLayers runs resident layers [lo, hi) over the batch.
func (m *Model) ForwardLayers(ctx context.Context, lo, hi int, b *Batch, phase Phase) error {
	for L := lo; L < hi; L++ {
		l := m.Layers[L]
		if l == nil {
			return fmt.Errorf("model: layer %d is not resident on this holder", L)
		}
		if err := m.RunLayer(ctx, l, b, phase); err != nil {
			return err
		}
	}
	return nil
}

// Logits applies the final AttnRes mix, norm and lm_head to the last row of
// each sequence in the batch (spec §3.7), after the last layer.
func (m *Model) Logits(b *Batch) ([][]float32, error) {
	rows := make([]int, len(b.Spans))
	for i, sp := range b.Spans {
		rows[i] = sp.Hi - 1
	}
	return m.logitsOf(b, rows)
}

// RowLogits is Logits for every row of every sequence: out[i][r] is row r
// of sequence i (a verify span's rows, each as decoding it alone gives).
func (m *Model) RowLogits(b *Batch) ([][][]float32, error) {
	var rows []int
	for _, sp := range b.Spans {
		for r := sp.Lo; r < sp.Hi; r++ {
			rows = append(rows, r)
		}
	}
	flat, err := m.logitsOf(b, rows)
	if err != nil {
		return nil, err
	}
	out := make([][][]float32, len(b.Spans))
	for i, sp := range b.Spans {
		out[i], flat = flat[:sp.Len():sp.Len()], flat[sp.Len():]
	}
	return out, nil
}

// logitsOf applies the final mix, norm and lm_head to the given rows of
// the batch.
func (m *Model) logitsOf(b *Batch, rows []int) ([][]float32, error) {
	logits, err := m.headOf(b, rows)
	if err != nil {
		return nil, err
	}
	be, n := m.Backend, len(rows)
	v := m.Cfg.VocabSize
	flat := make([]float32, n*v)
	if m.split() {
		if err := m.gatherLogits(flat, logits); err != nil {
			return nil, err
		}
	} else {
		be.Download(flat, logits)
	}
	be.Free(logits)
	out := make([][]float32, n)
	for i := range out {
		out[i] = flat[i*v : (i+1)*v : (i+1)*v]
	}
	return out, nil
}

// headOf is the lm_head's output [len(rows), its vocabulary range] for the
// given rows, after the final mix and norm.
func (m *Model) headOf(b *Batch, rows []int) (*kernels.Tensor, error) {
	if m.Globals == nil || m.Globals.LMHead == nil {
		return nil, fmt.Errorf("model: lm_head is not loaded on this holder")
	}
	if want := m.Cfg.StackLenAfter(m.Cfg.NumLayers - 1); len(b.Stack) != want {
		return nil, fmt.Errorf("model: final mix expects %d AttnRes blocks, batch has %d (did every layer run?)", want, len(b.Stack))
	}
	be, d := m.Backend, m.Cfg.HiddenSize
	n := len(rows)
	pick := func(t *kernels.Tensor) *kernels.Tensor {
		out := be.NewTensor(n, d)
		for i, r := range rows {
			be.CopyBlock(out, i, 0, t, r, 0, 1, d)
		}
		return out
	}
	stack := make([]*kernels.Tensor, len(b.Stack))
	for i, s := range b.Stack {
		stack[i] = pick(s)
	}
	p := pick(b.Partial)
	z := m.attnResMix(p, stack, m.Globals.outProj)
	free(be, p)
	free(be, stack...)
	be.RMSNorm(z, z, m.Globals.Norm, 0, float32(m.Cfg.RMSNormEps))
	logits := m.linear(z, m.Globals.LMHead)
	be.Free(z)
	return logits, nil
}

// Prefill runs the whole (resident) model over tokens[i] for each sequence,
// continuing from its state, and returns each sequence's last-position
// logits. States must hold every layer.
func (m *Model) Prefill(ctx context.Context, seqs []*SeqState, tokens [][]int32) ([][]float32, error) {
	return m.run(ctx, seqs, tokens, PhasePrefill, true)
}

// PrefillState is Prefill without the final mix and lm_head: what the
// prefill side of a disaggregated job computes.
func (m *Model) PrefillState(ctx context.Context, seqs []*SeqState, tokens [][]int32) error {
	_, err := m.run(ctx, seqs, tokens, PhasePrefill, false)
	return err
}

// Decode runs one token per sequence through the whole model as a batched
// decode step and returns the logits.
func (m *Model) Decode(ctx context.Context, seqs []*SeqState, ids []int32) ([][]float32, error) {
	tokens := make([][]int32, len(ids))
	for i := range ids {
		tokens[i] = ids[i : i+1]
	}
	return m.run(ctx, seqs, tokens, PhaseDecode, true)
}

func (m *Model) run(ctx context.Context, seqs []*SeqState, tokens [][]int32, phase Phase, logits bool) ([][]float32, error) {
	b, err := m.NewBatch(seqs, tokens)
	if err != nil {
		return nil, err
	}
	defer m.FreeBatch(b)
	if err := m.ForwardLayers(ctx, 0, m.Cfg.NumLayers, b, phase); err != nil {
		return nil, err
	}
	b.Advance()
	if !logits {
		return nil, nil
	}
	return m.Logits(b)
}

// FreeBatch returns the batch's activations (partial sum and block stack)
// to the backend; the batch must not be used afterwards.
func (m *Model) FreeBatch(b *Batch) {
	if b.Partial != nil {
		m.Backend.Free(b.Partial)
		b.Partial = nil
	}
	free(m.Backend, b.Stack...)
	b.Stack = nil
}

// Start is the monolithic reference of the disaggregated flow: it prefills
// prompt[:-1] into a fresh state (what the prefill worker does), then runs
// the last prompt token as a decode step (what the decode group does first)
// and returns the state and that step's logits.
func (m *Model) Start(ctx context.Context, prompt []int32) (*SeqState, []float32, error) {
	return m.StartMedia(ctx, prompt, nil)
}

// Generate greedily generates n tokens after prompt, by Start and then one
// decode step per token. The prefill worker + decode group must reproduce
// it exactly.
func (m *Model) Generate(ctx context.Context, prompt []int32, n int) ([]int32, error) {
	return m.GenerateMedia(ctx, prompt, nil, n)
}

// Argmax returns the index of the largest value (the first on ties).
func Argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
