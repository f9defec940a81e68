package vision

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// ErrNoVisionTower is returned by Load for a checkpoint without a vision
// tower (no vision_config, or none of its tensors): callers refuse image
// jobs with it.
var ErrNoVisionTower = errors.New("the checkpoint has no vision tower")

// Config is the vision tower's and projector's configuration: the released
// config.json's vision_config, with Kimi K3's values for fields it leaves
// out, and the text tower's width, which the projector maps into.
type Config struct {
	Hidden       int // vt_hidden_size: the tower's width (1024)
	Intermediate int // vt_intermediate_size: the MLP's hidden width (4096)
	Layers       int // vt_num_hidden_layers (27)
	Heads        int // vt_num_attention_heads (12)
	QKV          int // qkv_hidden_size: heads x head width (1536)
	Patch        int // patch_size: pixels a patch side (14)
	PosH, PosW   int // init_pos_emb_height, _width: the position table's grid (64x64)
	MergeH       int // merge_kernel_size: patches merged into one row (2x2)
	MergeW       int
	TextHidden   int // the text tower's hidden_size: the projector's output width

	// NormEps is the encoder norms' eps. The released code builds them
	// without one, so the framework takes the machine epsilon of the
	// compute dtype: 2^-7 for the BF16 the model runs in.
	NormEps float32
	// ProjectorEps is projector_ln_eps, the post norm's eps (1e-5).
	ProjectorEps float32
	// RopeTheta is the 2-D rotary embedding's base (10000), RopeMax the
	// largest grid side its table covers (512 patches).
	RopeTheta float64
	RopeMax   int
}

// HeadDim is the width of one attention head.
func (c *Config) HeadDim() int { return c.QKV / c.Heads }

// PatchValues is the number of pixel values of one patch (3 x 14 x 14).
func (c *Config) PatchValues() int { return 3 * c.Patch * c.Patch }

// MergedWidth is the width of a merged row (the projector's input).
func (c *Config) MergedWidth() int { return c.Hidden * c.MergeH * c.MergeW }

// K3 returns Kimi K3's released vision configuration for a text tower of
// width textHidden.
func K3(textHidden int) Config {
	return Config{
		Hidden: 1024, Intermediate: 4096, Layers: 27, Heads: 12, QKV: 1536,
		Patch: 14, PosH: 64, PosW: 64, MergeH: 2, MergeW: 2, TextHidden: textHidden,
		NormEps: bf16Eps, ProjectorEps: 1e-5, RopeTheta: 10000, RopeMax: 512,
	}
}

// bf16Eps is BF16's machine epsilon (7 fraction bits).
const bf16Eps = 1.0 / 128

// rawConfig is the released vision_config; pointer fields tell a missing
// key from a zero.
type rawConfig struct {
	Hidden       *int     `json:"vt_hidden_size"`
	Intermediate *int     `json:"vt_intermediate_size"`
	Layers       *int     `json:"vt_num_hidden_layers"`
	Heads        *int     `json:"vt_num_attention_heads"`
	QKV          *int     `json:"qkv_hidden_size"`
	Patch        *int     `json:"patch_size"`
	PosH         *int     `json:"init_pos_emb_height"`
	PosW         *int     `json:"init_pos_emb_width"`
	Merge        []int    `json:"merge_kernel_size"`
	MMHidden     *int     `json:"mm_hidden_size"`
	TextHidden   *int     `json:"text_hidden_size"`
	ProjectorEps *float64 `json:"projector_ln_eps"`

	// The released choices; any other value is refused, since this package
	// computes only these.
	MergeType     *string `json:"merge_type"`
	ProjectorType *string `json:"mm_projector_type"`
	NormType      *string `json:"norm_type"`
	Activation    *string `json:"activation_func"`
	ProjectorAct  *string `json:"projector_hidden_act"`
	PosEmbType    *string `json:"pos_emb_type"`
	Interpolation *string `json:"pos_emb_interpolation_mode"`
	AttnBias      *bool   `json:"attn_bias"`
	LinearBias    *bool   `json:"linear_bias"`
	PatchBias     *bool   `json:"patch_embed_proj_bias"`
}

// maxDim bounds every size read from a config, so that a hostile config
// cannot size an allocation.
const maxDim = 1 << 16

// ParseConfig reads a released vision_config (raw JSON) for a text tower
// of width textHidden. A null or empty vision_config is ErrNoVisionTower.
func ParseConfig(raw json.RawMessage, textHidden int) (*Config, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("config.json has no vision_config: %w", ErrNoVisionTower)
	}
	var r rawConfig
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("config.json: vision_config: %w", err)
	}
	c := K3(textHidden)
	for _, f := range []struct {
		dst *int
		src *int
	}{
		{&c.Hidden, r.Hidden}, {&c.Intermediate, r.Intermediate}, {&c.Layers, r.Layers},
		{&c.Heads, r.Heads}, {&c.QKV, r.QKV}, {&c.Patch, r.Patch}, {&c.PosH, r.PosH}, {&c.PosW, r.PosW},
	} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
	if r.Merge != nil {
		if len(r.Merge) != 2 {
			return nil, fmt.Errorf("config.json: vision_config: merge_kernel_size %v, want two sizes", r.Merge)
		}
		c.MergeH, c.MergeW = r.Merge[0], r.Merge[1]
	}
	if r.ProjectorEps != nil {
		c.ProjectorEps = float32(*r.ProjectorEps)
	}
	if err := r.checkChoices(); err != nil {
		return nil, err
	}
	if r.MMHidden != nil && *r.MMHidden != c.Hidden {
		return nil, fmt.Errorf("config.json: vision_config: mm_hidden_size %d differs from vt_hidden_size %d", *r.MMHidden, c.Hidden)
	}
	if r.TextHidden != nil && *r.TextHidden != textHidden {
		return nil, fmt.Errorf("config.json: vision_config: text_hidden_size %d differs from the text tower's hidden_size %d", *r.TextHidden, textHidden)
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("config.json: vision_config: %w", err)
	}
	return &c, nil
}

// checkChoices refuses a vision_config that asks for a computation other
// than the released one.
func (r *rawConfig) checkChoices() error {
	for _, s := range []struct {
		key  string
		v    *string
		want string
	}{
		{"merge_type", r.MergeType, "sd2_tpool"},
		{"mm_projector_type", r.ProjectorType, "patchmergerv2"},
		{"norm_type", r.NormType, "rmsnorm"},
		{"activation_func", r.Activation, "gelu_pytorch_tanh"},
		{"projector_hidden_act", r.ProjectorAct, "gelu"},
		{"pos_emb_type", r.PosEmbType, "divided_fixed"},
		{"pos_emb_interpolation_mode", r.Interpolation, "bilinear"},
	} {
		if s.v != nil && *s.v != s.want {
			return fmt.Errorf("config.json: vision_config: %s is %q; this tower computes only %q (Kimi K3's)", s.key, *s.v, s.want)
		}
	}
	for _, b := range []struct {
		key string
		v   *bool
	}{{"attn_bias", r.AttnBias}, {"linear_bias", r.LinearBias}, {"patch_embed_proj_bias", r.PatchBias}} {
		if b.v != nil && *b.v {
			return fmt.Errorf("config.json: vision_config: %s is true; Kimi K3's tower has no biases and this one computes none", b.key)
		}
	}
	return nil
}

func (c *Config) validate() error {
	for _, f := range []struct {
		key string
		v   int
	}{
		{"vt_hidden_size", c.Hidden}, {"vt_intermediate_size", c.Intermediate}, {"vt_num_hidden_layers", c.Layers},
		{"vt_num_attention_heads", c.Heads}, {"qkv_hidden_size", c.QKV}, {"patch_size", c.Patch},
		{"init_pos_emb_height", c.PosH}, {"init_pos_emb_width", c.PosW},
		{"merge_kernel_size[0]", c.MergeH}, {"merge_kernel_size[1]", c.MergeW}, {"text hidden_size", c.TextHidden},
	} {
		if f.v <= 0 || f.v > maxDim {
			return fmt.Errorf("%s %d is out of range (1..%d)", f.key, f.v, maxDim)
		}
	}
	if c.QKV%c.Heads != 0 || c.HeadDim()%4 != 0 {
		return fmt.Errorf("qkv_hidden_size %d over %d heads: the head width must be a whole multiple of 4 (the 2-D rotary embedding's x and y pairs)", c.QKV, c.Heads)
	}
	if c.Patch > 64 || c.MergeH > 8 || c.MergeW > 8 || c.PosH*c.PosW > maxDim {
		return fmt.Errorf("patch_size %d, merge_kernel_size %dx%d or position grid %dx%d out of range", c.Patch, c.MergeH, c.MergeW, c.PosH, c.PosW)
	}
	if math.IsNaN(float64(c.ProjectorEps)) || c.ProjectorEps <= 0 || c.ProjectorEps > 1 {
		return fmt.Errorf("projector_ln_eps %g is out of range (0, 1]", c.ProjectorEps)
	}
	return nil
}
