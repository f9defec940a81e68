package model

import "github.com/tandem-inference/tandem/kernels"

// The weight structs bind their fields to the released tensor names (spec
// §5.2) in one place, the `k3` struct tags; the binder (bind.go) reads them.
// A tag names a tensor relative to the struct's prefix:
//
//   - *kernels.Matrix fields name a weight's base (without ".weight"); its
//     storage (dense, MXFP4 weight_packed + weight_scale, MXFP8 F8 weight +
//     weight_scale) is decided from the checkpoint header;
//   - []float32 fields name a small vector, widened to fp32 (",row" accepts a
//     [1, n] matrix as a vector);
//   - *kernels.Tensor fields name a short-conv weight [P, 1, K], kept [P, K].

// Globals are the model-level tensors: embedding, final mix, norm and head.
type Globals struct {
	Embed       *kernels.Matrix `k3:"language_model.model.embed_tokens"`
	Norm        []float32       `k3:"language_model.model.norm.weight"`
	OutResNorm  []float32       `k3:"language_model.model.output_attn_res_norm.weight"`
	OutResProjW []float32       `k3:"language_model.model.output_attn_res_proj.weight,row"`
	LMHead      *kernels.Matrix `k3:"language_model.lm_head"`
	// VocabBase is the first token id of LMHead's rows: 0, or a tensor
	// rank's vocabulary range (ShardGlobals).
	VocabBase int

	outProj []float32 // OutResNorm ⊙ OutResProjW (spec §3.2 fold)
}

// Layer holds one decoder layer's weights (prefix
// "language_model.model.layers.L."). Exactly one of KDA/MLA and one of
// Dense/MoE is set.
type Layer struct {
	Index int
	Kind  LayerKind

	InputNorm    []float32 `k3:"input_layernorm.weight"`
	PostAttnNorm []float32 `k3:"post_attention_layernorm.weight"`
	AttnResNorm  []float32 `k3:"self_attention_res_norm.weight"`
	AttnResProjW []float32 `k3:"self_attention_res_proj.weight,row"`
	MLPResNorm   []float32 `k3:"mlp_res_norm.weight"`
	MLPResProjW  []float32 `k3:"mlp_res_proj.weight,row"`

	KDA   *KDAWeights `k3:"self_attn."`
	MLA   *MLAWeights `k3:"self_attn."`
	Dense *FFNWeights `k3:"mlp."`
	MoE   *MoEWeights `k3:"block_sparse_moe."`

	attnProj, mlpProj []float32 // folded AttnRes norm ⊙ proj
}

// KDAWeights are a KDA layer's attention weights (spec §3.3).
type KDAWeights struct {
	QProj  *kernels.Matrix `k3:"q_proj"`
	KProj  *kernels.Matrix `k3:"k_proj"`
	VProj  *kernels.Matrix `k3:"v_proj"`
	GProj  *kernels.Matrix `k3:"g_proj"` // full-rank output gate
	OProj  *kernels.Matrix `k3:"o_proj"`
	FAProj *kernels.Matrix `k3:"f_a_proj"`
	FBProj *kernels.Matrix `k3:"f_b_proj"`
	BProj  *kernels.Matrix `k3:"b_proj"`
	QConv  *kernels.Tensor `k3:"q_conv1d.weight"`
	KConv  *kernels.Tensor `k3:"k_conv1d.weight"`
	VConv  *kernels.Tensor `k3:"v_conv1d.weight"`
	ALog   []float32       `k3:"A_log"` // per head; stored padded (only the first H are used)
	DtBias []float32       `k3:"dt_bias"`
	ONorm  []float32       `k3:"o_norm.weight"` // shared by all heads
}

// MLAWeights are a gated NoPE MLA layer's attention weights (spec §3.4).
type MLAWeights struct {
	QAProj  *kernels.Matrix `k3:"q_a_proj"`
	QANorm  []float32       `k3:"q_a_layernorm.weight"`
	QBProj  *kernels.Matrix `k3:"q_b_proj"`
	KVAProj *kernels.Matrix `k3:"kv_a_proj_with_mqa"`
	KVANorm []float32       `k3:"kv_a_layernorm.weight"`
	KVBProj *kernels.Matrix `k3:"kv_b_proj"`
	OProj   *kernels.Matrix `k3:"o_proj"`
	GProj   *kernels.Matrix `k3:"g_proj"`
}

// FFNWeights are a SiTU-GLU MLP: the dense FFN of layer 0 and the shared
// experts (spec §3.5).
type FFNWeights struct {
	GateProj *kernels.Matrix `k3:"gate_proj"`
	UpProj   *kernels.Matrix `k3:"up_proj"`
	DownProj *kernels.Matrix `k3:"down_proj"`
}

// MoEWeights are a Stable LatentMoE layer's weights (spec §3.6).
type MoEWeights struct {
	Router     *kernels.Matrix  `k3:"gate"`
	RouterBias []float32        `k3:"gate.e_score_correction_bias"`
	LatentDown *kernels.Matrix  `k3:"routed_expert_down_proj"`
	LatentUp   *kernels.Matrix  `k3:"routed_expert_up_proj"`
	LatentNorm []float32        `k3:"routed_expert_norm.weight"`
	Shared     *FFNWeights      `k3:"shared_experts."`
	Experts    []kernels.Expert // experts.E.w1 / w3 / w2, bound by index
	// ExpertBase is the id of Experts[0]: 0, or the first of a tensor
	// rank's experts (ShardLayer).
	ExpertBase int
}

// fold precomputes the AttnRes score vectors (norm weight ⊙ projection).
func (l *Layer) fold() {
	l.attnProj = foldProj(l.AttnResNorm, l.AttnResProjW)
	l.mlpProj = foldProj(l.MLPResNorm, l.MLPResProjW)
}

func (g *Globals) fold() { g.outProj = foldProj(g.OutResNorm, g.OutResProjW) }

func foldProj(norm, proj []float32) []float32 {
	out := make([]float32, len(proj))
	for i := range out {
		out[i] = norm[i] * proj[i]
	}
	return out
}
