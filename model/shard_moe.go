package model

import (
	"context"

	"github.com/tandem-inference/tandem/kernels"
)

// moeShardForward is a tensor rank's Stable LatentMoE (shard.go): the
// router and z replicated, the rank's routed experts summed into u_t, its
// part of the shared expert, one reduction of both, then the aggregate
// norm and the up projection on the whole u, as moeForward does.
func (m *Model) moeShardForward(ctx context.Context, w *MoEWeights, x *kernels.Tensor) (*kernels.Tensor, error) {
	be, c := m.Backend, m.Cfg
	T, k := x.Rows, c.TopK
	logits := m.linear(x, w.Router)
	ids := make([]int32, T*k)
	weights := make([]float32, T*k)
	be.RouterTopK(logits, w.RouterBias, k, c.Renormalize, float32(c.RoutedScale), ids, weights)
	be.Free(logits)

	u := be.NewTensor(T, c.LatentDim)
	if lids, lw, kk := localSlots(ids, weights, k, w.ExpertBase, len(w.Experts)); kk > 0 {
		z := m.linear(x, w.LatentDown)
		be.RoutedExperts(u, z, lids, lw, kk, w.Experts, float32(c.SiTUBeta1), float32(c.SiTUBeta2))
		be.Free(z)
	}
	parts := []*kernels.Tensor{u}
	if w.Shared != nil {
		parts = append(parts, m.ffnForward(w.Shared, x))
	}
	if err := m.reduce(ctx, parts...); err != nil {
		free(be, parts...)
		return nil, err
	}
	if c.LatentMoENorm {
		be.RMSNorm(u, u, w.LatentNorm, 0, float32(c.RoutedNormEps))
	}
	y := m.linear(u, w.LatentUp)
	be.Free(u)
	if len(parts) > 1 {
		be.Add(y, y, parts[1])
		be.Free(parts[1])
	}
	return y, nil
}

// localSlots keeps, of the router's choice ids/weights [T, k], each row's
// slots routed to experts [base, base+n), in slot order, with ids relative
// to base. Rows are padded to the largest row's count kk with weight-0
// slots of an expert already in use, which add exactly zero (a row with no
// expert here sums to zero). kk is 0 when no row routes here.
func localSlots(ids []int32, weights []float32, k, base, n int) (lids []int32, lw []float32, kk int) {
	T := len(ids) / k
	counts := make([]int, T)
	pad := int32(-1)
	for i, e := range ids {
		if l := int(e) - base; l >= 0 && l < n {
			counts[i/k]++
			if pad < 0 {
				pad = int32(l)
			}
		}
	}
	for _, c := range counts {
		kk = max(kk, c)
	}
	if kk == 0 {
		return nil, nil, 0
	}
	lids, lw = make([]int32, T*kk), make([]float32, T*kk)
	for r := 0; r < T; r++ {
		j, first := r*kk, pad
		for s := r * k; s < (r+1)*k; s++ {
			if l := int(ids[s]) - base; l >= 0 && l < n {
				if j == r*kk {
					first = int32(l)
				}
				lids[j], lw[j] = int32(l), weights[s]
				j++
			}
		}
		for ; j < (r+1)*kk; j++ {
			lids[j] = first // weight 0
		}
	}
	return lids, lw, kk
}
