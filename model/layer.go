package model

import (
	"context"

	"github.com/tandem-inference/tandem/kernels"
)

// forward runs decoder layer l over the batch (spec §3.2): AttnRes mix into
// the attention, a block push at block starts, KDA or MLA, AttnRes mix into
// the FFN (dense or LatentMoE), each added to the block's partial sum. A
// tensor rank (shard.go) sums the attention's and the FFN's partial outputs
// over its stage: the only errors are the reductions'.
func (m *Model) forwardLayer(ctx context.Context, l *Layer, b *Batch, phase Phase) error {
	be, c := m.Backend, m.Cfg
	L := l.Index
	inAttn := b.Partial
	if len(b.Stack) > 0 {
		inAttn = m.attnResMix(b.Partial, b.Stack, l.attnProj)
	}
	var partial *kernels.Tensor
	if c.IsBlockStart(L) {
		b.Stack = append(b.Stack, b.Partial) // the finished block; a new one starts
	} else {
		partial = b.Partial
	}

	x := be.NewTensor(inAttn.Rows, inAttn.Cols)
	be.RMSNorm(x, inAttn, l.InputNorm, 0, float32(c.RMSNormEps))
	if inAttn != b.Partial {
		be.Free(inAttn)
	}
	var a *kernels.Tensor
	switch l.Kind {
	case KDA:
		a = m.kdaForward(L, l.KDA, x, b, phase)
	case MLA:
		a = m.mlaForward(L, l.MLA, x, b, phase)
	}
	be.Free(x)
	if m.split() {
		if err := m.reduce(ctx, a); err != nil {
			be.Free(a)
			return err
		}
	}
	if partial == nil {
		partial = a
	} else {
		be.Add(partial, partial, a)
		be.Free(a)
	}

	inMLP := m.attnResMix(partial, b.Stack, l.mlpProj)
	be.RMSNorm(inMLP, inMLP, l.PostAttnNorm, 0, float32(c.RMSNormEps))
	var f *kernels.Tensor
	var err error
	switch {
	case l.Dense != nil && m.split():
		f = m.ffnForward(l.Dense, inMLP)
		err = m.reduce(ctx, f)
	case l.Dense != nil:
		f = m.ffnForward(l.Dense, inMLP)
	case m.split():
		f, err = m.moeShardForward(ctx, l.MoE, inMLP)
	default:
		f = m.moeForward(l.MoE, inMLP)
	}
	be.Free(inMLP)
	if f != nil {
		be.Add(partial, partial, f)
		be.Free(f)
	}
	b.Partial = partial
	return err
}
