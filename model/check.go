package model

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/kernels"
)

// shapeCheck accumulates the first shape mismatch between bound weights and
// the config, naming the tensor.
type shapeCheck struct{ err error }

func (s *shapeCheck) mat(m *kernels.Matrix, rows, cols int) {
	if s.err == nil && (m.Rows != rows || m.Cols != cols) {
		s.err = fmt.Errorf("weight %s is [%d, %d]; the config needs [%d, %d]", m.Name, m.Rows, m.Cols, rows, cols)
	}
}

func (s *shapeCheck) vec(name string, v []float32, n int) {
	if s.err == nil && len(v) != n {
		s.err = fmt.Errorf("tensor %s has %d values; the config needs %d", name, len(v), n)
	}
}

func (s *shapeCheck) conv(name string, t *kernels.Tensor, p, k int) {
	if s.err == nil && (t.Rows != p || t.Cols != k) {
		s.err = fmt.Errorf("tensor %s is [%d, 1, %d]; the config needs [%d, 1, %d]", name, t.Rows, t.Cols, p, k)
	}
}

// check verifies every weight's shape against the config (spec §5.2).
func (l *Layer) check(c *Config) error {
	var s shapeCheck
	d := c.HiddenSize
	for _, v := range []struct {
		name string
		v    []float32
	}{{"input_layernorm", l.InputNorm}, {"post_attention_layernorm", l.PostAttnNorm},
		{"self_attention_res_norm", l.AttnResNorm}, {"self_attention_res_proj", l.AttnResProjW},
		{"mlp_res_norm", l.MLPResNorm}, {"mlp_res_proj", l.MLPResProjW}} {
		s.vec(v.name, v.v, d)
	}
	if w := l.KDA; w != nil {
		P, H, D, K := c.KDAProjDim(), c.KDAHeads, c.KDAHeadDim, c.ConvKernel
		s.mat(w.QProj, P, d)
		s.mat(w.KProj, P, d)
		s.mat(w.VProj, P, d)
		s.mat(w.GProj, P, d)
		s.mat(w.OProj, d, P)
		s.mat(w.FAProj, D, d)
		s.mat(w.FBProj, P, D)
		s.mat(w.BProj, H, d)
		s.conv("q_conv1d", w.QConv, P, K)
		s.conv("k_conv1d", w.KConv, P, K)
		s.conv("v_conv1d", w.VConv, P, K)
		s.vec("A_log", w.ALog, c.ALogStored())
		s.vec("dt_bias", w.DtBias, P)
		s.vec("o_norm", w.ONorm, D)
	}
	if w := l.MLA; w != nil {
		H := c.MLAHeads
		s.mat(w.QAProj, c.QLoraRank, d)
		s.vec("q_a_layernorm", w.QANorm, c.QLoraRank)
		s.mat(w.QBProj, H*c.QHeadDim(), c.QLoraRank)
		s.mat(w.KVAProj, c.LatentWidth(), d)
		s.vec("kv_a_layernorm", w.KVANorm, c.KVLoraRank)
		s.mat(w.KVBProj, H*(c.QKNopeDim+c.VHeadDim), c.KVLoraRank)
		s.mat(w.OProj, d, H*c.VHeadDim)
		s.mat(w.GProj, H*c.VHeadDim, d)
	}
	if w := l.Dense; w != nil {
		s.mat(w.GateProj, c.IntermediateSize, d)
		s.mat(w.UpProj, c.IntermediateSize, d)
		s.mat(w.DownProj, d, c.IntermediateSize)
	}
	if w := l.MoE; w != nil {
		s.mat(w.Router, c.NumExperts, d)
		s.vec("gate.e_score_correction_bias", w.RouterBias, c.NumExperts)
		s.mat(w.LatentDown, c.LatentDim, d)
		s.mat(w.LatentUp, d, c.LatentDim)
		s.vec("routed_expert_norm", w.LatentNorm, c.LatentDim)
		if w.Shared != nil {
			s.mat(w.Shared.GateProj, c.SharedWidth(), d)
			s.mat(w.Shared.UpProj, c.SharedWidth(), d)
			s.mat(w.Shared.DownProj, d, c.SharedWidth())
		}
		for _, e := range w.Experts {
			s.mat(e.W1, c.MoEIntermediate, c.LatentDim)
			s.mat(e.W3, c.MoEIntermediate, c.LatentDim)
			s.mat(e.W2, c.LatentDim, c.MoEIntermediate)
		}
	}
	return s.err
}

func f32at(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }
