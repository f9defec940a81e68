// Package modelconfig is Kimi K3's config.json: parsing the released nested
// (or a flat) configuration and the one validation every process applies to
// it, the coordinator (through coordinator/modelinfo) and the workers and
// tools (through package model) alike. It holds no model math, so the
// coordinator can use it without the kernels.
//
// Every count and width has a limit (see Limits) far above any released
// model, checked before anything is sized by it: a hostile config.json is
// refused in microseconds, not by the out-of-memory killer. Package model
// also checks the layer count against the checkpoint's tensors before it
// sizes anything by it.
package modelconfig

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// LayerKind tells which attention a decoder layer uses.
type LayerKind uint8

const (
	KDA LayerKind = iota + 1 // Kimi Delta Attention (linear, recurrent state)
	MLA                      // gated NoPE multi-head latent attention (latent KV cache)
)

func (k LayerKind) String() string {
	switch k {
	case KDA:
		return "kda"
	case MLA:
		return "mla"
	}
	return fmt.Sprintf("LayerKind(%d)", uint8(k))
}

// Config is the text configuration the math needs (spec §2), parsed from the
// released nested config.json. Layer lists are 0-based here.
type Config struct {
	HiddenSize int `json:"hidden_size"`
	NumLayers  int `json:"num_hidden_layers"`
	VocabSize  int `json:"vocab_size"`
	// MaxPositions is the longest sequence (prompt + output); 1M when the
	// config does not say.
	MaxPositions int `json:"max_position_embeddings"`

	// Epsilons: every norm has its own. RMSNormEps covers the decoder and
	// final norms; LatentNormEps the MLA q_a/kv_a latent norms (1e-6 in the
	// published code, 1e-5 in vLLM/MLX/C ports, spec §7 Q1); KDAOutNormEps the
	// per-head o_norm; AttnResEps the unweighted key norm of AttnRes;
	// RoutedNormEps the LatentMoE aggregate norm.
	RMSNormEps    float64 `json:"rms_norm_eps"`
	LatentNormEps float64 `json:"latent_norm_eps"`
	KDAOutNormEps float64 `json:"kda_out_norm_eps"`
	AttnResEps    float64 `json:"attn_res_eps"`
	RoutedNormEps float64 `json:"routed_norm_eps"`
	// KDAQKNormEps is the L2-norm eps of KDA q and k (fla: 1e-6).
	KDAQKNormEps float64 `json:"kda_qk_norm_eps"`

	// KDA (linear_attn_config).
	KDAHeads       int     `json:"kda_num_heads"`
	KDAHeadDim     int     `json:"kda_head_dim"`
	ConvKernel     int     `json:"short_conv_kernel_size"`
	GateLowerBound float64 `json:"gate_lower_bound"`
	// ALogLen is the stored length of A_log (the release pads 96 heads to 128);
	// only the first KDAHeads entries are used. 0 means KDAHeads.
	ALogLen int `json:"a_log_len"`

	// MLA.
	MLAHeads   int `json:"num_attention_heads"`
	QLoraRank  int `json:"q_lora_rank"`
	KVLoraRank int `json:"kv_lora_rank"`
	QKNopeDim  int `json:"qk_nope_head_dim"`
	QKRopeDim  int `json:"qk_rope_head_dim"`
	VHeadDim   int `json:"v_head_dim"`

	// FFN and MoE.
	FirstKDense      int     `json:"first_k_dense_replace"`
	IntermediateSize int     `json:"intermediate_size"`
	NumExperts       int     `json:"num_experts"`
	TopK             int     `json:"num_experts_per_token"`
	NumShared        int     `json:"num_shared_experts"`
	MoEIntermediate  int     `json:"moe_intermediate_size"`
	LatentDim        int     `json:"routed_expert_hidden_size"`
	RoutedScale      float64 `json:"routed_scaling_factor"`
	Renormalize      bool    `json:"moe_renormalize"`
	LatentMoENorm    bool    `json:"latent_moe_use_norm"`
	SiTUBeta1        float64 `json:"activation_situ_beta"`
	SiTUBeta2        float64 `json:"activation_situ_linear_beta"`

	AttnResBlockSize int `json:"attn_res_block_size"`

	// MLALayers and KDALayers are the 0-based layer indices of each kind.
	MLALayers []int `json:"mla_layers"`
	KDALayers []int `json:"kda_layers"`

	BOSTokenID int `json:"bos_token_id"`
	EOSTokenID int `json:"eos_token_id"`
	PadTokenID int `json:"pad_token_id"`

	// Quant is the compressed-tensors quantization config; nil for a dense
	// checkpoint. The loader still decides per tensor from the header.
	Quant *QuantConfig `json:"quantization_config,omitempty"`

	// Vision keeps the vision tower's config verbatim for later use.
	Vision json.RawMessage `json:"vision_config,omitempty"`

	kinds []LayerKind // derived: kind of each layer
}

// QuantConfig is the part of compressed-tensors' quantization_config that
// tells how routed experts are stored.
type QuantConfig struct {
	QuantMethod string   `json:"quant_method"`
	Format      string   `json:"format"`
	GroupSize   int      `json:"group_size"`
	NumBits     int      `json:"num_bits"`
	Ignore      []string `json:"ignore"`
}

// Default epsilons, spec §2.1 and §3, and the default longest sequence.
const (
	DefaultRMSNormEps    = 1e-5
	DefaultLatentNormEps = 1e-6
	DefaultQKNormEps     = 1e-6
	DefaultMaxPositions  = 1 << 20
)

// Limits on a config's counts and widths: far above any released model (K3:
// 93 layers, hidden 7168, vocab 163840, 896 experts, 96 KDA heads of 128,
// 1M positions) and low enough that what a process sizes by a config before
// it has checked it against the checkpoint (the layer tables, a sequence's
// state descriptors) stays small, and that no product of two widths
// overflows. A config outside them is refused naming the field.
const (
	MaxLayers       = 1 << 10 // num_hidden_layers
	MaxHidden       = 1 << 16 // hidden_size
	MaxVocab        = 1 << 22 // vocab_size
	MaxPositions    = 1 << 26 // max_position_embeddings
	MaxHeads        = 1 << 12 // attention heads of either kind
	MaxHeadDim      = 1 << 12 // per-head widths
	MaxRank         = 1 << 16 // q_lora_rank, kv_lora_rank
	MaxIntermediate = 1 << 18 // dense, expert and latent widths
	MaxExperts      = 1 << 14 // num_experts
	MaxConvKernel   = 1 << 6  // short_conv_kernel_size
)

// LayerKind returns the attention kind of 0-based layer L.
func (c *Config) LayerKind(L int) LayerKind { return c.kinds[L] }

// IsDense reports whether layer L has the dense FFN (otherwise LatentMoE).
func (c *Config) IsDense(L int) bool { return L < c.FirstKDense }

// IsBlockStart reports whether layer L pushes the finished AttnRes block
// before its attention (spec §3.2: L % block_size == 0).
func (c *Config) IsBlockStart(L int) bool { return L%c.AttnResBlockSize == 0 }

// StackLenBefore is the AttnRes block-stack length seen at the input of layer
// L (before a push at L). The stack is empty only before layer 0.
func (c *Config) StackLenBefore(L int) int {
	if L == 0 {
		return 0
	}
	return (L-1)/c.AttnResBlockSize + 1
}

// StackLenAfter is the stack length after layer L has run.
func (c *Config) StackLenAfter(L int) int { return L/c.AttnResBlockSize + 1 }

// Derived widths.
func (c *Config) KDAProjDim() int  { return c.KDAHeads * c.KDAHeadDim }
func (c *Config) QHeadDim() int    { return c.QKNopeDim + c.QKRopeDim }
func (c *Config) LatentWidth() int { return c.KVLoraRank + c.QKRopeDim } // MLA cache row: c_kv + k_pe
func (c *Config) SharedWidth() int { return c.NumShared * c.MoEIntermediate }

// MediaPadOffset is <|media_pad|>'s place among the 256 special ids that
// end the vocabulary (163605 - 163584 in the released one).
const MediaPadOffset = 21

// MediaPadID is the id of <|media_pad|> in c's vocabulary: the K3 special
// layout, which synthetic tokenizers keep in their last 256 ids too. A
// prompt holds one per feature row of an image.
func (c *Config) MediaPadID() int32 { return int32(c.VocabSize - 256 + MediaPadOffset) }
func (c *Config) ALogStored() int {
	if c.ALogLen > 0 {
		return c.ALogLen
	}
	return c.KDAHeads
}

// rawConfig mirrors the released nested config.json (spec §2.1).
type rawConfig struct {
	ModelType      string          `json:"model_type"`
	TextConfig     *rawText        `json:"text_config"`
	VisionConfig   json.RawMessage `json:"vision_config"`
	BOSTokenID     *int            `json:"bos_token_id"`
	EOSTokenID     *int            `json:"eos_token_id"`
	PadTokenID     *int            `json:"pad_token_id"`
	QuantizationTo json.RawMessage `json:"quantization_config"`
	rawText                        // a flat (text-only) config is accepted too
}

type rawText struct {
	HiddenSize        *int     `json:"hidden_size"`
	NumHiddenLayers   *int     `json:"num_hidden_layers"`
	VocabSize         *int     `json:"vocab_size"`
	MaxPositions      *int     `json:"max_position_embeddings"`
	RMSNormEps        *float64 `json:"rms_norm_eps"`
	LatentNormEps     *float64 `json:"mla_latent_norm_eps"` // tandem extension (spec §7 Q1)
	NumAttentionHeads *int     `json:"num_attention_heads"`
	QLoraRank         *int     `json:"q_lora_rank"`
	KVLoraRank        *int     `json:"kv_lora_rank"`
	QKNopeHeadDim     *int     `json:"qk_nope_head_dim"`
	QKRopeHeadDim     *int     `json:"qk_rope_head_dim"`
	VHeadDim          *int     `json:"v_head_dim"`
	MLAUseNope        *bool    `json:"mla_use_nope"`
	MLAUseOutputGate  *bool    `json:"mla_use_output_gate"`
	FirstKDense       *int     `json:"first_k_dense_replace"`
	MoELayerFreq      *int     `json:"moe_layer_freq"`
	IntermediateSize  *int     `json:"intermediate_size"`
	HiddenAct         *string  `json:"hidden_act"`
	SiTUBeta          *float64 `json:"activation_situ_beta"`
	SiTULinearBeta    *float64 `json:"activation_situ_linear_beta"`
	NumExperts        *int     `json:"num_experts"`
	TopK              *int     `json:"num_experts_per_token"`
	NumShared         *int     `json:"num_shared_experts"`
	MoEIntermediate   *int     `json:"moe_intermediate_size"`
	LatentDim         *int     `json:"routed_expert_hidden_size"`
	LatentMoEUseNorm  *bool    `json:"latent_moe_use_norm"`
	RouterActivation  *string  `json:"moe_router_activation_func"`
	Renormalize       *bool    `json:"moe_renormalize"`
	RoutedScale       *float64 `json:"routed_scaling_factor"`
	TopKMethod        *string  `json:"topk_method"`
	NumExpertGroup    *int     `json:"num_expert_group"`
	TopKGroup         *int     `json:"topk_group"`
	AttnResBlockSize  *int     `json:"attn_res_block_size"`
	NextN             *int     `json:"num_nextn_predict_layers"`
	TieWordEmbeddings *bool    `json:"tie_word_embeddings"`
	LinearAttn        *struct {
		KDALayers        []int    `json:"kda_layers"`
		FullAttnLayers   []int    `json:"full_attn_layers"`
		NumHeads         *int     `json:"num_heads"`
		HeadDim          *int     `json:"head_dim"`
		ShortConvKernel  *int     `json:"short_conv_kernel_size"`
		GateLowerBound   *float64 `json:"gate_lower_bound"`
		UseFullRankGate  *bool    `json:"use_full_rank_gate"`
		ALogStoredLength *int     `json:"a_log_stored_length"` // tandem extension; default head_dim
	} `json:"linear_attn_config"`
	Quantization json.RawMessage `json:"quantization_config"`
	BOSTokenID   *int            `json:"bos_token_id"`
	EOSTokenID   *int            `json:"eos_token_id"`
	PadTokenID   *int            `json:"pad_token_id"`
}

// Load reads and validates config.json at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read model config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse parses a released (nested) or flat text config and validates it.
func Parse(b []byte) (*Config, error) {
	var raw rawConfig
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("config.json is not valid JSON: %w", err)
	}
	t := raw.TextConfig
	prefix := "text_config."
	if t == nil {
		t = &raw.rawText
		prefix = ""
	}
	var errs fieldErrors
	c := &Config{Vision: raw.VisionConfig}
	req := func(name string, p *int) int {
		if p == nil {
			errs.add(prefix+name, "is missing")
			return 0
		}
		return *p
	}
	reqF := func(name string, p *float64) float64 {
		if p == nil {
			errs.add(prefix+name, "is missing")
			return 0
		}
		return *p
	}
	c.HiddenSize = req("hidden_size", t.HiddenSize)
	c.NumLayers = req("num_hidden_layers", t.NumHiddenLayers)
	c.VocabSize = req("vocab_size", t.VocabSize)
	c.MaxPositions = DefaultMaxPositions
	if t.MaxPositions != nil {
		c.MaxPositions = *t.MaxPositions
	}
	c.RMSNormEps = reqF("rms_norm_eps", t.RMSNormEps)
	c.LatentNormEps = DefaultLatentNormEps
	if t.LatentNormEps != nil {
		c.LatentNormEps = *t.LatentNormEps
	}
	c.KDAOutNormEps = c.RMSNormEps
	c.AttnResEps = c.RMSNormEps
	c.RoutedNormEps = c.RMSNormEps
	c.KDAQKNormEps = DefaultQKNormEps

	c.MLAHeads = req("num_attention_heads", t.NumAttentionHeads)
	c.QLoraRank = req("q_lora_rank", t.QLoraRank)
	c.KVLoraRank = req("kv_lora_rank", t.KVLoraRank)
	c.QKNopeDim = req("qk_nope_head_dim", t.QKNopeHeadDim)
	c.QKRopeDim = req("qk_rope_head_dim", t.QKRopeHeadDim)
	c.VHeadDim = req("v_head_dim", t.VHeadDim)
	c.FirstKDense = req("first_k_dense_replace", t.FirstKDense)
	c.IntermediateSize = req("intermediate_size", t.IntermediateSize)
	c.NumExperts = req("num_experts", t.NumExperts)
	c.TopK = req("num_experts_per_token", t.TopK)
	c.NumShared = req("num_shared_experts", t.NumShared)
	c.MoEIntermediate = req("moe_intermediate_size", t.MoEIntermediate)
	c.LatentDim = req("routed_expert_hidden_size", t.LatentDim)
	c.RoutedScale = reqF("routed_scaling_factor", t.RoutedScale)
	c.SiTUBeta1 = reqF("activation_situ_beta", t.SiTUBeta)
	c.SiTUBeta2 = reqF("activation_situ_linear_beta", t.SiTULinearBeta)
	c.AttnResBlockSize = req("attn_res_block_size", t.AttnResBlockSize)
	if t.Renormalize == nil {
		errs.add(prefix+"moe_renormalize", "is missing")
	} else {
		c.Renormalize = *t.Renormalize
	}
	c.LatentMoENorm = true
	if t.LatentMoEUseNorm != nil {
		c.LatentMoENorm = *t.LatentMoEUseNorm
	}

	// Features this implementation computes; refuse configs that ask for others.
	if t.HiddenAct != nil && *t.HiddenAct != "situ" {
		errs.add(prefix+"hidden_act", fmt.Sprintf("is %q; only \"situ\" is implemented", *t.HiddenAct))
	}
	if t.RouterActivation != nil && *t.RouterActivation != "sigmoid" {
		errs.add(prefix+"moe_router_activation_func", fmt.Sprintf("is %q; only \"sigmoid\" is implemented", *t.RouterActivation))
	}
	if t.MLAUseNope != nil && !*t.MLAUseNope {
		errs.add(prefix+"mla_use_nope", "is false; rotary MLA is not K3 and is not implemented")
	}
	if t.MLAUseOutputGate != nil && !*t.MLAUseOutputGate {
		errs.add(prefix+"mla_use_output_gate", "is false; K3's MLA always has the output gate")
	}
	if t.NumExpertGroup != nil && *t.NumExpertGroup != 1 {
		errs.add(prefix+"num_expert_group", fmt.Sprintf("is %d; only one expert group (no group masking) is implemented", *t.NumExpertGroup))
	}
	if t.MoELayerFreq != nil && *t.MoELayerFreq != 1 {
		errs.add(prefix+"moe_layer_freq", fmt.Sprintf("is %d; K3 has MoE on every layer after first_k_dense_replace", *t.MoELayerFreq))
	}
	if t.NextN != nil && *t.NextN != 0 {
		errs.add(prefix+"num_nextn_predict_layers", "is not 0; MTP layers are not implemented")
	}
	if t.TieWordEmbeddings != nil && *t.TieWordEmbeddings {
		errs.add(prefix+"tie_word_embeddings", "is true; K3 has a separate lm_head")
	}

	la := t.LinearAttn
	if la == nil {
		errs.add(prefix+"linear_attn_config", "is missing")
	} else {
		lp := prefix + "linear_attn_config."
		c.KDAHeads = req("linear_attn_config.num_heads", la.NumHeads)
		c.KDAHeadDim = req("linear_attn_config.head_dim", la.HeadDim)
		c.ConvKernel = req("linear_attn_config.short_conv_kernel_size", la.ShortConvKernel)
		c.GateLowerBound = reqF("linear_attn_config.gate_lower_bound", la.GateLowerBound)
		if la.UseFullRankGate != nil && !*la.UseFullRankGate {
			errs.add(lp+"use_full_rank_gate", "is false; only K3's full-rank output gate is implemented")
		}
		// The release pads A_log to head_dim floats (spec §5.2).
		c.ALogLen = c.KDAHeadDim
		if la.ALogStoredLength != nil {
			c.ALogLen = *la.ALogStoredLength
		}
		if la.FullAttnLayers == nil {
			errs.add(lp+"full_attn_layers", "is missing")
		}
		// The lists are sized by the layer count: bound it first.
		if c.NumLayers >= 1 && c.NumLayers <= MaxLayers {
			c.MLALayers, c.KDALayers = convertLayerLists(la.FullAttnLayers, la.KDALayers, c.NumLayers, lp, &errs)
		}
	}

	bos, eos, pad := t.BOSTokenID, t.EOSTokenID, t.PadTokenID
	if raw.TextConfig != nil {
		if raw.BOSTokenID != nil {
			bos = raw.BOSTokenID
		}
		if raw.EOSTokenID != nil {
			eos = raw.EOSTokenID
		}
		if raw.PadTokenID != nil {
			pad = raw.PadTokenID
		}
	}
	c.BOSTokenID, c.EOSTokenID, c.PadTokenID = -1, -1, -1
	if bos != nil {
		c.BOSTokenID = *bos
	}
	if eos != nil {
		c.EOSTokenID = *eos
	}
	if pad != nil {
		c.PadTokenID = *pad
	}

	qraw := t.Quantization
	if len(qraw) == 0 || string(qraw) == "null" {
		qraw = raw.QuantizationTo
	}
	if len(qraw) > 0 && string(qraw) != "null" {
		q, err := parseQuant(qraw)
		if err != nil {
			errs.add(prefix+"quantization_config", err.Error())
		}
		c.Quant = q
	}

	if len(errs) > 0 {
		return nil, errs
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// convertLayerLists turns the 1-based full_attn_layers / kda_layers lists into
// 0-based MLA and KDA lists, checking that together they cover every layer once.
func convertLayerLists(full, kda []int, n int, lp string, errs *fieldErrors) (mla0, kda0 []int) {
	seen := make(map[int]string, n)
	conv := func(name string, list []int) []int {
		if len(list) > n {
			// Each layer may be listed once: a longer list is wrong as
			// a whole, and one error says so (an error per entry of a
			// hostile list of millions would be the cost).
			errs.add(lp+name, fmt.Sprintf("lists %d layers, more than the %d there are", len(list), n))
			return nil
		}
		out := make([]int, 0, len(list))
		for _, l := range list {
			if l < 1 || l > n {
				errs.add(lp+name, fmt.Sprintf("holds layer %d, outside 1..%d (the lists are 1-based)", l, n))
				continue
			}
			if prev, dup := seen[l]; dup {
				errs.add(lp+name, fmt.Sprintf("layer %d is also listed in %s", l, prev))
				continue
			}
			seen[l] = name
			out = append(out, l-1)
		}
		sort.Ints(out)
		return out
	}
	mla0 = conv("full_attn_layers", full)
	if kda == nil {
		// Not listed: every other layer is KDA.
		for L := 0; L < n; L++ {
			if _, ok := seen[L+1]; !ok {
				kda0 = append(kda0, L)
			}
		}
		return mla0, kda0
	}
	kda0 = conv("kda_layers", kda)
	if len(mla0)+len(kda0) != n && len(*errs) == 0 {
		errs.add(lp+"kda_layers", fmt.Sprintf("kda_layers (%d) and full_attn_layers (%d) do not cover all %d layers", len(kda0), len(mla0), n))
	}
	return mla0, kda0
}

func parseQuant(b []byte) (*QuantConfig, error) {
	var q struct {
		QuantMethod  string   `json:"quant_method"`
		Format       string   `json:"format"`
		Ignore       []string `json:"ignore"`
		ConfigGroups map[string]struct {
			Format  string `json:"format"`
			Weights *struct {
				NumBits   int    `json:"num_bits"`
				GroupSize int    `json:"group_size"`
				Type      string `json:"type"`
			} `json:"weights"`
		} `json:"config_groups"`
	}
	if err := json.Unmarshal(b, &q); err != nil {
		return nil, fmt.Errorf("not a compressed-tensors quantization config: %w", err)
	}
	out := &QuantConfig{QuantMethod: q.QuantMethod, Format: q.Format, Ignore: q.Ignore}
	for name, g := range q.ConfigGroups {
		if g.Weights == nil {
			continue
		}
		if out.GroupSize != 0 && (out.GroupSize != g.Weights.GroupSize || out.NumBits != g.Weights.NumBits) {
			return nil, fmt.Errorf("config group %s has group_size %d / num_bits %d, differing from another group", name, g.Weights.GroupSize, g.Weights.NumBits)
		}
		out.GroupSize, out.NumBits = g.Weights.GroupSize, g.Weights.NumBits
		if out.Format == "" {
			out.Format = g.Format
		}
	}
	if out.QuantMethod != "compressed-tensors" {
		return nil, fmt.Errorf("quant_method %q is not supported (want compressed-tensors)", out.QuantMethod)
	}
	switch out.Format {
	case "mxfp4-pack-quantized":
		if out.NumBits != 4 || out.GroupSize != 32 {
			return nil, fmt.Errorf("format mxfp4-pack-quantized needs num_bits 4 and group_size 32, have %d and %d", out.NumBits, out.GroupSize)
		}
	case "mxfp8-quantized", "float-quantized", "naive-quantized":
		if out.GroupSize != 0 && out.GroupSize != 32 {
			return nil, fmt.Errorf("format %s: group_size %d is not the MX block of 32", out.Format, out.GroupSize)
		}
	default:
		return nil, fmt.Errorf("format %q is not supported (want mxfp4-pack-quantized or an MXFP8 format)", out.Format)
	}
	return out, nil
}

// Validate checks every field the math needs and their consistency. It names
// the offending field so that a user can fix the config.
func (c *Config) Validate() error {
	var errs fieldErrors
	pos := func(name string, v int) {
		if v <= 0 {
			errs.add(name, fmt.Sprintf("must be positive, is %d", v))
		}
	}
	// in checks lo <= v <= hi.
	in := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			errs.add(name, fmt.Sprintf("is %d, want %d..%d", v, lo, hi))
		}
	}
	in("hidden_size", c.HiddenSize, 1, MaxHidden)
	in("num_hidden_layers", c.NumLayers, 1, MaxLayers)
	in("vocab_size", c.VocabSize, 1, MaxVocab)
	in("max_position_embeddings", c.MaxPositions, 2, MaxPositions)
	in("linear_attn_config.num_heads", c.KDAHeads, 1, MaxHeads)
	in("linear_attn_config.head_dim", c.KDAHeadDim, 1, MaxHeadDim)
	in("linear_attn_config.short_conv_kernel_size", c.ConvKernel, 1, MaxConvKernel)
	in("num_attention_heads", c.MLAHeads, 1, MaxHeads)
	in("q_lora_rank", c.QLoraRank, 1, MaxRank)
	in("kv_lora_rank", c.KVLoraRank, 1, MaxRank)
	in("qk_nope_head_dim", c.QKNopeDim, 1, MaxHeadDim)
	in("qk_rope_head_dim", c.QKRopeDim, 0, MaxHeadDim)
	in("v_head_dim", c.VHeadDim, 1, MaxHeadDim)
	in("attn_res_block_size", c.AttnResBlockSize, 1, MaxLayers)
	for _, id := range []struct {
		name string
		v    int
	}{{"bos_token_id", c.BOSTokenID}, {"eos_token_id", c.EOSTokenID}, {"pad_token_id", c.PadTokenID}} {
		if id.v < -1 || (id.v >= c.VocabSize && c.VocabSize > 0) {
			errs.add(id.name, fmt.Sprintf("is %d, outside the vocabulary 0..%d", id.v, c.VocabSize-1))
		}
	}
	for _, e := range []struct {
		name string
		v    float64
	}{{"rms_norm_eps", c.RMSNormEps}, {"mla_latent_norm_eps", c.LatentNormEps}, {"kda_out_norm_eps", c.KDAOutNormEps},
		{"attn_res_eps", c.AttnResEps}, {"routed_norm_eps", c.RoutedNormEps}, {"kda_qk_norm_eps", c.KDAQKNormEps}} {
		if !(e.v > 0 && e.v < 1) {
			errs.add(e.name, fmt.Sprintf("must be in (0, 1), is %g", e.v))
		}
	}
	if !(c.GateLowerBound < 0) {
		errs.add("linear_attn_config.gate_lower_bound", fmt.Sprintf("must be negative (a log decay bound), is %g", c.GateLowerBound))
	}
	if c.ALogLen != 0 && c.ALogLen < c.KDAHeads {
		errs.add("linear_attn_config.a_log_stored_length", fmt.Sprintf("is %d, fewer than the %d heads", c.ALogLen, c.KDAHeads))
	}
	if c.ALogLen > MaxHeads {
		errs.add("linear_attn_config.a_log_stored_length", fmt.Sprintf("is %d, more than %d", c.ALogLen, MaxHeads))
	}
	if c.FirstKDense < 0 || c.FirstKDense > c.NumLayers {
		errs.add("first_k_dense_replace", fmt.Sprintf("is %d, outside 0..%d", c.FirstKDense, c.NumLayers))
	}
	if c.FirstKDense > 0 {
		in("intermediate_size", c.IntermediateSize, 1, MaxIntermediate)
	}
	if c.FirstKDense < c.NumLayers {
		in("num_experts", c.NumExperts, 1, MaxExperts)
		pos("num_experts_per_token", c.TopK)
		in("moe_intermediate_size", c.MoEIntermediate, 1, MaxIntermediate)
		in("routed_expert_hidden_size", c.LatentDim, 1, MaxIntermediate)
		in("num_shared_experts", c.NumShared, 0, MaxExperts)
		if c.TopK > c.NumExperts {
			errs.add("num_experts_per_token", fmt.Sprintf("is %d, more than num_experts %d", c.TopK, c.NumExperts))
		}
		if !(c.RoutedScale > 0) {
			errs.add("routed_scaling_factor", fmt.Sprintf("must be positive, is %g", c.RoutedScale))
		}
	}
	if !(c.SiTUBeta1 > 0) {
		errs.add("activation_situ_beta", fmt.Sprintf("must be positive, is %g", c.SiTUBeta1))
	}
	if !(c.SiTUBeta2 > 0) {
		errs.add("activation_situ_linear_beta", fmt.Sprintf("must be positive, is %g", c.SiTUBeta2))
	}
	if c.Quant != nil && c.Quant.Format == "mxfp4-pack-quantized" && c.FirstKDense < c.NumLayers {
		// Routed experts are the quantized tensors: their input widths are the
		// latent (w1, w3) and moe_intermediate (w2); both must hold whole MX blocks.
		if c.LatentDim%32 != 0 {
			errs.add("routed_expert_hidden_size", fmt.Sprintf("is %d, not a multiple of the MXFP4 group 32", c.LatentDim))
		}
		if c.MoEIntermediate%32 != 0 {
			errs.add("moe_intermediate_size", fmt.Sprintf("is %d, not a multiple of the MXFP4 group 32", c.MoEIntermediate))
		}
	}
	if len(errs) > 0 {
		return errs // the checks below index by the layer count
	}
	if len(c.MLALayers)+len(c.KDALayers) != c.NumLayers {
		errs.add("linear_attn_config", fmt.Sprintf("%d MLA + %d KDA layers do not make num_hidden_layers %d", len(c.MLALayers), len(c.KDALayers), c.NumLayers))
	}
	if len(errs) > 0 {
		return errs
	}
	c.kinds = make([]LayerKind, c.NumLayers)
	for _, L := range c.MLALayers {
		if L < 0 || L >= c.NumLayers {
			return append(errs, fmt.Sprintf("linear_attn_config layer %d (0-based) is outside 0..%d", L, c.NumLayers-1))
		}
		c.kinds[L] = MLA
	}
	for _, L := range c.KDALayers {
		if L < 0 || L >= c.NumLayers {
			return append(errs, fmt.Sprintf("linear_attn_config layer %d (0-based) is outside 0..%d", L, c.NumLayers-1))
		}
		if c.kinds[L] != 0 {
			errs.add("linear_attn_config", fmt.Sprintf("layer %d (0-based) is both MLA and KDA", L))
		}
		c.kinds[L] = KDA
	}
	for L, k := range c.kinds {
		if k == 0 {
			errs.add("linear_attn_config", fmt.Sprintf("layer %d (0-based) is in neither list", L))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// fieldErrors collects every problem so that one run of the loader tells the
// user all of them, each naming its field.
type fieldErrors []string

func (e *fieldErrors) add(field, msg string) { *e = append(*e, field+" "+msg) }

// maxShownProblems bounds the problems an error's text lists; the rest are
// counted.
const maxShownProblems = 50

// Error lists the problems, at most maxShownProblems of them, in time and
// space linear in what it shows.
func (e fieldErrors) Error() string {
	if len(e) == 1 {
		return "invalid model config: " + e[0]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "invalid model config (%d problems):", len(e))
	for _, m := range e[:min(len(e), maxShownProblems)] {
		b.WriteString("\n  ")
		b.WriteString(m)
	}
	if len(e) > maxShownProblems {
		fmt.Fprintf(&b, "\n  ... and %d more", len(e)-maxShownProblems)
	}
	return b.String()
}
