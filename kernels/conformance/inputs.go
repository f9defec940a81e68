package conformance

import (
	"hash/fnv"
	"math"
	"math/rand/v2"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// gen draws a case's inputs; each case has its own stream, so adding or
// filtering cases does not change another case's inputs.
type gen struct{ r *rand.Rand }

func (s *suite) gen(name string) *gen {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &gen{rand.New(rand.NewPCG(s.opt.Seed, h.Sum64()))}
}

// normal returns n draws of N(0, sd²).
func (g *gen) normal(n int, sd float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(g.r.NormFloat64() * sd)
	}
	return v
}

// uniform returns n draws from [lo, hi).
func (g *gen) uniform(n int, lo, hi float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(lo + (hi-lo)*g.r.Float64())
	}
	return v
}

// matrix returns a weight [rows, cols] of the format with N(0, 1/cols)
// values (unit-variance outputs for unit-variance inputs), quantised to
// the format the way a checkpoint is.
func (g *gen) matrix(name string, f kernels.Format, rows, cols int) *kernels.Matrix {
	vals := g.normal(rows*cols, 1/math.Sqrt(float64(cols)))
	m := &kernels.Matrix{Name: name, Rows: rows, Cols: cols, Format: f}
	switch f {
	case kernels.F32:
		return kernels.NewF32Matrix(name, rows, cols, vals)
	case kernels.BF16:
		m.Data = make([]byte, 2*len(vals))
		for i, v := range vals {
			u := mxfp.F32ToBF16(v)
			m.Data[2*i], m.Data[2*i+1] = byte(u), byte(u>>8)
		}
	case kernels.MXFP4:
		m.Data = make([]byte, rows*cols/2)
		m.Scales = make([]byte, rows*cols/kernels.MXBlock)
		mxfp.QuantizeMXFP4(m.Data, m.Scales, vals)
	case kernels.MXFP8E4M3, kernels.MXFP8E5M2:
		m.Data = make([]byte, rows*cols)
		m.Scales = make([]byte, rows*cols/kernels.MXBlock)
		mxfp.QuantizeMXFP8(m.Data, m.Scales, vals, f == kernels.MXFP8E5M2)
	default:
		panic("conformance: no generator for " + f.String())
	}
	return m
}

// RandomMatrix is a weight [rows, cols] of the format with N(0, 1/cols)
// values quantised to the format, drawn from seed: what the suite's cases
// use, for benchmarks that want the same inputs.
func RandomMatrix(seed uint64, name string, f kernels.Format, rows, cols int) *kernels.Matrix {
	g := &gen{rand.New(rand.NewPCG(seed, 0))}
	return g.matrix(name, f, rows, cols)
}

// spans lays sequences of the given lengths back to back.
func spans(lens ...int) []kernels.Span {
	out := make([]kernels.Span, len(lens))
	off := 0
	for i, n := range lens {
		out[i] = kernels.Span{Lo: off, Hi: off + n}
		off += n
	}
	return out
}

func rowsOf(sp []kernels.Span) int { return sp[len(sp)-1].Hi }

// hostT is a reference (CPU) tensor holding a copy of data.
func hostT(rows, cols int, data []float32) *kernels.Tensor {
	return &kernels.Tensor{Rows: rows, Cols: cols, Data: append([]float32(nil), data...)}
}

// put is a backend tensor holding data.
func (s *suite) put(rows, cols int, data []float32) *kernels.Tensor {
	t := s.be.NewTensor(rows, cols)
	s.be.Upload(t, data)
	return t
}

// get downloads a backend tensor.
func (s *suite) get(t *kernels.Tensor) []float32 {
	v := make([]float32, t.Rows*t.Cols)
	s.be.Download(v, t)
	return v
}

// bind binds weights on the backend; the returned func releases them.
func (s *suite) bind(ms ...*kernels.Matrix) func() {
	for i, m := range ms {
		if err := s.be.Bind(m); err != nil {
			for _, b := range ms[:i] {
				s.be.Release(b)
			}
			panic("conformance: binding " + m.Name + ": " + err.Error())
		}
	}
	return func() {
		for _, m := range ms {
			s.be.Release(m)
		}
	}
}

func (s *suite) free(ts ...*kernels.Tensor) {
	for _, t := range ts {
		s.be.Free(t)
	}
}
