package synth

import (
	"fmt"
	"math"

	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/vision"
)

// Kind says how a tensor's bytes are generated.
type Kind uint8

const (
	KindDense  Kind = iota // BF16/F32 values, uniform with Mean and Std
	KindPacked             // MXFP4 weight_packed: random nibbles
	KindScale              // E8M0 weight_scale: exponents in [Lo, Hi]
	KindALog               // KDA A_log: log(U(1,16)) per head, zero padding
)

// Tensor is one tensor of the synthetic checkpoint.
type Tensor struct {
	Name      string
	DType     safetensors.DType
	Shape     []int64
	Kind      Kind
	Mean, Std float64
	Lo, Hi    int // E8M0 exponent range
	Heads     int // A_log: entries that are real heads
}

// Elems is the number of elements.
func (t Tensor) Elems() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Bytes is the tensor's data size.
func (t Tensor) Bytes() int64 { return t.Elems() * int64(t.DType.Size()) }

// TensorPlan is every tensor of a model, per layer and model-level.
type TensorPlan struct {
	Layers  [][]Tensor
	Globals []Tensor
}

// All lists every tensor.
func (p *TensorPlan) All() []Tensor {
	var out []Tensor
	for _, l := range p.Layers {
		out = append(out, l...)
	}
	return append(out, p.Globals...)
}

// Plan lays out the released tensors of cfg (spec §5.2) with the scales the
// synthetic weights use.
func Plan(c *model.Config) *TensorPlan {
	d := int64(c.HiddenSize)
	p := &TensorPlan{Layers: make([][]Tensor, c.NumLayers)}
	std := func(gain float64, fanIn int64) float64 { return gain / math.Sqrt(float64(fanIn)) }
	bf := func(name string, gain float64, shape ...int64) Tensor {
		return Tensor{Name: name, DType: safetensors.BF16, Shape: shape, Std: std(gain, shape[len(shape)-1])}
	}
	norm := func(name string, n int64, dt safetensors.DType) Tensor {
		return Tensor{Name: name, DType: dt, Shape: []int64{n}, Mean: 1, Std: 0.1}
	}
	for L := 0; L < c.NumLayers; L++ {
		pre := model.LayerPrefix(L)
		var ts []Tensor
		ts = append(ts,
			norm(pre+"input_layernorm.weight", d, safetensors.BF16),
			norm(pre+"post_attention_layernorm.weight", d, safetensors.BF16),
			norm(pre+"self_attention_res_norm.weight", d, safetensors.BF16),
			norm(pre+"mlp_res_norm.weight", d, safetensors.BF16),
			// AttnRes scores of std ~2: the depth softmax is far from uniform.
			bf(pre+"self_attention_res_proj.weight", 2, 1, d),
			bf(pre+"mlp_res_proj.weight", 2, 1, d),
		)
		a := pre + "self_attn."
		switch c.LayerKind(L) {
		case model.KDA:
			P, H, D, K := int64(c.KDAProjDim()), int64(c.KDAHeads), int64(c.KDAHeadDim), int64(c.ConvKernel)
			ts = append(ts,
				bf(a+"q_proj.weight", 1, P, d), bf(a+"k_proj.weight", 1, P, d), bf(a+"v_proj.weight", 1, P, d),
				bf(a+"g_proj.weight", 1, P, d), bf(a+"o_proj.weight", 0.5, d, P),
				bf(a+"f_a_proj.weight", 1, D, d),
				bf(a+"f_b_proj.weight", 2, P, D), // decay gate inputs of std ~2 span the (-5, 0) range
				bf(a+"b_proj.weight", 1, H, d),
				Tensor{Name: a + "q_conv1d.weight", DType: safetensors.F32, Shape: []int64{P, 1, K}, Std: 0.5},
				Tensor{Name: a + "k_conv1d.weight", DType: safetensors.F32, Shape: []int64{P, 1, K}, Std: 0.5},
				Tensor{Name: a + "v_conv1d.weight", DType: safetensors.F32, Shape: []int64{P, 1, K}, Std: 0.5},
				Tensor{Name: a + "A_log", DType: safetensors.F32, Shape: []int64{int64(c.ALogStored())}, Kind: KindALog, Heads: c.KDAHeads},
				Tensor{Name: a + "dt_bias", DType: safetensors.F32, Shape: []int64{P}, Std: 0.5},
				norm(a+"o_norm.weight", D, safetensors.F32),
			)
		case model.MLA:
			H := int64(c.MLAHeads)
			ts = append(ts,
				bf(a+"q_a_proj.weight", 1, int64(c.QLoraRank), d),
				norm(a+"q_a_layernorm.weight", int64(c.QLoraRank), safetensors.BF16),
				bf(a+"q_b_proj.weight", 1, H*int64(c.QHeadDim()), int64(c.QLoraRank)),
				bf(a+"kv_a_proj_with_mqa.weight", 1, int64(c.LatentWidth()), d),
				norm(a+"kv_a_layernorm.weight", int64(c.KVLoraRank), safetensors.BF16),
				bf(a+"kv_b_proj.weight", 1, H*int64(c.QKNopeDim+c.VHeadDim), int64(c.KVLoraRank)),
				bf(a+"o_proj.weight", 0.5, d, H*int64(c.VHeadDim)),
				bf(a+"g_proj.weight", 1, H*int64(c.VHeadDim), d),
			)
		}
		if c.IsDense(L) {
			ts = append(ts, situMLP(pre+"mlp.", d, int64(c.IntermediateSize))...)
		} else {
			m := pre + "block_sparse_moe."
			E, lat, inter := int64(c.NumExperts), int64(c.LatentDim), int64(c.MoEIntermediate)
			ts = append(ts,
				bf(m+"gate.weight", 1.5, E, d), // router logits of std 1.5
				// A selection bias of std 0.2 against sigmoid scores reorders the top-k.
				Tensor{Name: m + "gate.e_score_correction_bias", DType: safetensors.F32, Shape: []int64{E}, Std: 0.2},
				bf(m+"routed_expert_down_proj.weight", 1, lat, d),
				bf(m+"routed_expert_up_proj.weight", 0.5, d, lat),
				norm(m+"routed_expert_norm.weight", lat, safetensors.BF16),
			)
			if c.NumShared > 0 {
				ts = append(ts, situMLP(m+"shared_experts.", d, int64(c.SharedWidth()))...)
			}
			for e := int64(0); e < E; e++ {
				x := fmt.Sprintf("%sexperts.%d.", m, e)
				// Output rms targets: gate ~3 (β1 = 4 engages), up ~20 (β2 = 25
				// engages), down ~1 over SiTU outputs of rms ~10.
				// Released order within an expert: w1, w2, w3, each packed
				// then scale.
				ts = append(ts, mxfp4(x+"w1", inter, lat, 3, 1)...)
				ts = append(ts, mxfp4(x+"w2", lat, inter, 1, 10)...)
				ts = append(ts, mxfp4(x+"w3", inter, lat, 20, 1)...)
			}
		}
		p.Layers[L] = ts
	}
	V := int64(c.VocabSize)
	p.Globals = []Tensor{
		{Name: "language_model.model.embed_tokens.weight", DType: safetensors.BF16, Shape: []int64{V, d}, Std: 1},
		norm("language_model.model.norm.weight", d, safetensors.BF16),
		norm("language_model.model.output_attn_res_norm.weight", d, safetensors.BF16),
		bf("language_model.model.output_attn_res_proj.weight", 2, 1, d),
		bf("language_model.lm_head.weight", 3, V, d), // logits of std ~3: a clear argmax
	}
	return p
}

// situMLP is a dense SiTU-GLU MLP (the layer-0 FFN, the shared experts),
// scaled so that both caps engage: gate pre-activations of std 4, up of
// std 15, and a down projection that brings outputs back to std ~1.
func situMLP(prefix string, d, inter int64) []Tensor {
	return []Tensor{
		{Name: prefix + "gate_proj.weight", DType: safetensors.BF16, Shape: []int64{inter, d}, Std: 4 / math.Sqrt(float64(d))},
		{Name: prefix + "up_proj.weight", DType: safetensors.BF16, Shape: []int64{inter, d}, Std: 15 / math.Sqrt(float64(d))},
		{Name: prefix + "down_proj.weight", DType: safetensors.BF16, Shape: []int64{d, inter}, Std: 1 / (30 * math.Sqrt(float64(inter)))},
	}
}

// e2m1RMS is the rms of E2M1 values when all 16 codes are equally likely.
var e2m1RMS = math.Sqrt((0 + 0.25 + 1 + 2.25 + 4 + 9 + 16 + 36) / 8)

// mxfp4 is an MXFP4 weight [rows, cols] whose outputs have rms about
// target for inputs of rms inRMS: the E8M0 exponent is centred on the scale
// that gives that, spread over four values.
func mxfp4(base string, rows, cols int64, target, inRMS float64) []Tensor {
	want := target / (e2m1RMS * math.Sqrt(float64(cols)) * inRMS)
	s := 127 + roundLog2(want)
	lo := max(1, min(250, s-2))
	return []Tensor{
		{Name: base + ".weight_packed", DType: safetensors.U8, Shape: []int64{rows, cols / 2}, Kind: KindPacked},
		{Name: base + ".weight_scale", DType: safetensors.U8, Shape: []int64{rows, cols / 32}, Kind: KindScale, Lo: lo, Hi: lo + 3},
	}
}

// roundLog2 is math.Round(math.Log2(x)) for positive finite x, computed
// exactly so that a checkpoint's scales do not depend on the machine that
// wrote it (math.Log2's last bit differs between amd64 and arm64): x =
// f·2^e with f in [0.5, 1) rounds to e when f ≥ 1/√2. math.Sqrt2/2 is
// above 1/√2 and no float64 lies between them, so the comparison is exact.
func roundLog2(x float64) int {
	f, e := math.Frexp(x)
	if f >= math.Sqrt2/2 {
		return e
	}
	return e - 1
}

// VisionPlan lays out the vision tower's and projector's tensors under
// their released names (K3-SPEC §5.5), all BF16, sized by the config's
// vision_config (vision.ParseConfig: the same reading the tower's loader
// does); none when the config has no vision_config. Projections have
// outputs of rms about their inputs' (gain 1/√fan-in), the position table
// values of std 0.5 (positions differ), norms 1 ± 0.1.
func VisionPlan(c *model.Config) (projector, tower []Tensor, err error) {
	if len(c.Vision) == 0 || string(c.Vision) == "null" {
		return nil, nil, nil
	}
	v, err := vision.ParseConfig(c.Vision, c.HiddenSize)
	if err != nil {
		return nil, nil, err
	}
	bf := func(name string, shape ...int) Tensor {
		s := make([]int64, len(shape))
		for i, d := range shape {
			s[i] = int64(d)
		}
		fan := 1
		for _, d := range shape[1:] {
			fan *= d
		}
		return Tensor{Name: name, DType: safetensors.BF16, Shape: s, Std: 1 / math.Sqrt(float64(fan))}
	}
	norm := func(name string, n int) Tensor {
		return Tensor{Name: name, DType: safetensors.BF16, Shape: []int64{int64(n)}, Mean: 1, Std: 0.1}
	}
	d, merged := v.Hidden, v.MergedWidth()
	projector = []Tensor{
		bf("mm_projector.proj.0.weight", merged, merged),
		bf("mm_projector.proj.2.weight", v.TextHidden, merged),
		norm("mm_projector.post_norm.weight", v.TextHidden),
	}
	pos := bf("vision_tower.patch_embed.pos_emb.weight", v.PosH, v.PosW, d)
	pos.Std = 0.5
	tower = []Tensor{
		bf("vision_tower.patch_embed.proj.weight", d, 3, v.Patch, v.Patch),
		pos,
		norm("vision_tower.encoder.final_layernorm.weight", d),
	}
	for i := 0; i < v.Layers; i++ {
		b := vision.BlockPrefix(i)
		tower = append(tower,
			norm(b+"norm0.weight", d), norm(b+"norm1.weight", d),
			bf(b+"wqkv.weight", 3*v.QKV, d), bf(b+"wo.weight", d, v.QKV),
			bf(b+"mlp.fc0.weight", v.Intermediate, d), bf(b+"mlp.fc1.weight", d, v.Intermediate),
		)
	}
	return projector, tower, nil
}
