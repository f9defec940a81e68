package cpu

import (
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/internal/expmath"
	"github.com/tandem-inference/tandem/kernels"
)

func sameShape(op string, a, b *kernels.Tensor) {
	if a.Rows != b.Rows || a.Cols != b.Cols {
		panic(fmt.Sprintf("cpu.%s: shape %v vs %v", op, a, b))
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + expmath.Exp(-float64(x)))) }

// sigmoidGo sets dst[i] = sigmoid(src[i]); dst may be src.
func sigmoidGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = sigmoid(v)
	}
}

// Embed gathers table rows.
func (b *Backend) Embed(dst *kernels.Tensor, table *kernels.Matrix, ids []int32) {
	if dst.Rows != len(ids) || dst.Cols != table.Cols {
		panic(fmt.Sprintf("cpu.Embed: %d ids of width %d into %v", len(ids), table.Cols, dst))
	}
	for i, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			panic(fmt.Sprintf("cpu.Embed: token id %d outside vocabulary of %d", id, table.Rows))
		}
		decodeRow(dst.Row(i), table, int(id))
	}
}

// RMSNorm normalises groups of each row; fp64 sum of squares, fp32 result.
func (b *Backend) RMSNorm(dst, x *kernels.Tensor, w []float32, group int, eps float32) {
	sameShape("RMSNorm", dst, x)
	if group == 0 {
		group = len(w)
		if group == 0 {
			group = x.Cols
		}
	}
	if x.Cols%group != 0 || (w != nil && len(w) != group) {
		panic(fmt.Sprintf("cpu.RMSNorm: %v with group %d and %d weights", x, group, len(w)))
	}
	n := x.Rows * (x.Cols / group)
	b.parallel(n, max(64, b.grainFor(n)), func(lo, hi int) {
		for g := lo; g < hi; g++ {
			xs := x.Data[g*group : (g+1)*group]
			ds := dst.Data[g*group : (g+1)*group]
			var ss float64
			for _, v := range xs {
				ss += float64(float64(v) * float64(v))
			}
			inv := float32(1 / math.Sqrt(ss/float64(group)+float64(eps)))
			if w == nil {
				for i, v := range xs {
					ds[i] = v * inv
				}
				continue
			}
			for i, v := range xs {
				ds[i] = w[i] * (v * inv)
			}
		}
	})
}

// L2NormGroups scales each group to unit L2 norm times scale, in place.
func (b *Backend) L2NormGroups(x *kernels.Tensor, group int, eps, scale float32) {
	if x.Cols%group != 0 {
		panic(fmt.Sprintf("cpu.L2NormGroups: %v with group %d", x, group))
	}
	n := x.Rows * (x.Cols / group)
	b.parallel(n, max(64, b.grainFor(n)), func(lo, hi int) {
		for g := lo; g < hi; g++ {
			xs := x.Data[g*group : (g+1)*group]
			var ss float64
			for _, v := range xs {
				ss += float64(float64(v) * float64(v))
			}
			inv := float32(1/math.Sqrt(ss+float64(eps))) * scale
			for i := range xs {
				xs[i] *= inv
			}
		}
	})
}

func (b *Backend) Add(dst, a, c *kernels.Tensor) {
	sameShape("Add", dst, a)
	sameShape("Add", a, c)
	ad, cd, dd := a.Data, c.Data[:len(a.Data)], dst.Data[:len(a.Data)]
	for i := range ad {
		dd[i] = ad[i] + cd[i]
	}
}

func (b *Backend) AddBias(x *kernels.Tensor, bias []float32) {
	if len(bias) != x.Cols {
		panic(fmt.Sprintf("cpu.AddBias: %v with %d biases", x, len(bias)))
	}
	for r := 0; r < x.Rows; r++ {
		row := x.Row(r)
		for i := range row {
			row[i] += bias[i]
		}
	}
}

func (b *Backend) Sigmoid(x *kernels.Tensor) { kernelsInUse.sigmoid(x.Data, x.Data) }

func (b *Backend) MulSigmoid(x, gate *kernels.Tensor) {
	sameShape("MulSigmoid", x, gate)
	b.parallel(len(x.Data), max(4096, b.grainFor(len(x.Data))), func(lo, hi int) {
		var sig [512]float32
		for i0 := lo; i0 < hi; i0 += len(sig) {
			xs := x.Data[i0:min(hi, i0+len(sig))]
			s := sig[:len(xs)]
			kernelsInUse.sigmoid(s, gate.Data[i0:i0+len(xs)])
			for i, v := range s {
				xs[i] *= v
			}
		}
	})
}

// situ is SiTU-GLU of one (gate, up) pair (spec §3.5): the sigmoid takes the
// uncapped gate.
func situ(g, u, beta1, beta2 float64) float64 {
	return beta1 * expmath.Tanh(g/beta1) * (1 / (1 + expmath.Exp(-g))) * beta2 * expmath.Tanh(u/beta2)
}

// AttnResMix is Block Attention Residuals' depth mix (spec §3.2).
func (b *Backend) AttnResMix(dst *kernels.Tensor, sources []*kernels.Tensor, proj []float32, eps float32) {
	for _, s := range sources {
		sameShape("AttnResMix", dst, s)
	}
	if len(proj) != dst.Cols {
		panic(fmt.Sprintf("cpu.AttnResMix: %d projection weights for width %d", len(proj), dst.Cols))
	}
	n := len(sources)
	b.parallel(dst.Rows, max(4, b.grainFor(dst.Rows)), func(lo, hi int) {
		scores := make([]float64, n)
		for r := lo; r < hi; r++ {
			maxs := math.Inf(-1)
			for j, s := range sources {
				v := s.Row(r)
				var ss, sp float64
				for i, x := range v {
					ss += float64(float64(x) * float64(x))
					sp += float64(float64(x) * float64(proj[i]))
				}
				scores[j] = sp / math.Sqrt(ss/float64(len(v))+float64(eps))
				maxs = math.Max(maxs, scores[j])
			}
			var sum float64
			for j := range scores {
				scores[j] = expmath.Exp(scores[j] - maxs)
				sum += scores[j]
			}
			out := dst.Row(r)
			clear(out)
			for j, s := range sources {
				wj := float32(scores[j] / sum)
				for i, x := range s.Row(r) {
					out[i] += float32(wj * x)
				}
			}
		}
	})
}
