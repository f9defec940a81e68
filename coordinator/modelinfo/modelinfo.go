// Package modelinfo is what the control plane needs to know about a model,
// read from its config.json without the model package (and so without the
// kernels): the layer count, the vocabulary, the longest sequence, the
// shape of the decode state the router prices, and an identity that every
// process serving the same model computes alike.
package modelinfo

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/tandem-inference/tandem/coordinator/router"
)

// ConfigFile is the model configuration's file name in a model directory.
const ConfigFile = "config.json"

// Info describes a model to the coordinator.
type Info struct {
	// ID identifies the model's configuration: workers of one job, and the
	// coordinator, must agree on it.
	ID           string
	NumLayers    int
	VocabSize    int
	MaxPositions int // longest sequence (prompt + output)
	EOSTokenID   int // -1 when the config names none
	// MLALayers and KDALayers are 0-based layer indices of each kind.
	MLALayers, KDALayers []int
	// Shape is the per-sequence decode state the router prices (bf16 MLA
	// rows, fp32 KDA state and conv tails).
	Shape router.Shape

	mlaRow, kdaFixed int64 // bytes: one token's MLA row; one KDA layer's state and conv tails
}

// rawText holds the fields read from config.json (released nested shape:
// under text_config; a flat config has them at the top).
type rawText struct {
	NumLayers    *int `json:"num_hidden_layers"`
	VocabSize    *int `json:"vocab_size"`
	MaxPositions *int `json:"max_position_embeddings"`
	KVLoraRank   *int `json:"kv_lora_rank"`
	QKRopeDim    *int `json:"qk_rope_head_dim"`
	EOSTokenID   *int `json:"eos_token_id"`
	LinearAttn   *struct {
		FullAttnLayers []int `json:"full_attn_layers"`
		KDALayers      []int `json:"kda_layers"`
		NumHeads       *int  `json:"num_heads"`
		HeadDim        *int  `json:"head_dim"`
		ShortConv      *int  `json:"short_conv_kernel_size"`
	} `json:"linear_attn_config"`
}

type rawConfig struct {
	rawText
	TextConfig *rawText `json:"text_config"`
	EOSTokenID *int     `json:"eos_token_id"`
}

// Load reads dir/config.json.
func Load(dir string) (*Info, error) {
	path := filepath.Join(dir, ConfigFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model info: %w", err)
	}
	info, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("model info: %s: %w", path, err)
	}
	return info, nil
}

// Identity is the model identity of the configuration in dir, as Load
// computes it, without parsing it.
func Identity(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return "", fmt.Errorf("model identity: %w", err)
	}
	return identity(b), nil
}

// identity hashes the configuration's bytes: two directories with the same
// config.json serve the same model shape. (Weights are not hashed: reading
// 1.5 TB to name a model is not an option; deployments that keep several
// checkpoints of one shape name them through configuration.)
func identity(config []byte) string {
	sum := sha256.Sum256(config)
	return "cfg-" + hex.EncodeToString(sum[:8])
}

// Parse reads a config.json's contents.
func Parse(config []byte) (*Info, error) {
	var raw rawConfig
	if err := json.Unmarshal(config, &raw); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	t, prefix := &raw.rawText, ""
	if raw.TextConfig != nil {
		t, prefix = raw.TextConfig, "text_config."
	}
	var errs []error
	need := func(name string, p *int, min int) int {
		switch {
		case p == nil:
			errs = append(errs, fmt.Errorf("%s%s is missing", prefix, name))
			return 0
		case *p < min:
			errs = append(errs, fmt.Errorf("%s%s is %d, want at least %d", prefix, name, *p, min))
			return 0
		}
		return *p
	}
	info := &Info{ID: identity(config), EOSTokenID: -1}
	info.NumLayers = need("num_hidden_layers", t.NumLayers, 1)
	info.VocabSize = need("vocab_size", t.VocabSize, 1)
	info.MaxPositions = 1 << 20
	if t.MaxPositions != nil {
		info.MaxPositions = need("max_position_embeddings", t.MaxPositions, 2)
	}
	kvLora := need("kv_lora_rank", t.KVLoraRank, 1)
	rope := need("qk_rope_head_dim", t.QKRopeDim, 0)
	if eos := raw.EOSTokenID; eos != nil {
		info.EOSTokenID = *eos
	} else if t.EOSTokenID != nil {
		info.EOSTokenID = *t.EOSTokenID
	}
	la := t.LinearAttn
	if la == nil {
		errs = append(errs, fmt.Errorf("%slinear_attn_config is missing", prefix))
		return nil, errors.Join(errs...)
	}
	heads := need("linear_attn_config.num_heads", la.NumHeads, 1)
	headDim := need("linear_attn_config.head_dim", la.HeadDim, 1)
	conv := need("linear_attn_config.short_conv_kernel_size", la.ShortConv, 1)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// The released lists are 1-based; together they cover every layer once.
	kind := make([]byte, info.NumLayers)
	for _, l := range []struct {
		name string
		list []int
		k    byte
	}{{"full_attn_layers", la.FullAttnLayers, 'm'}, {"kda_layers", la.KDALayers, 'k'}} {
		for _, L := range l.list {
			if L < 1 || L > info.NumLayers {
				return nil, fmt.Errorf("%slinear_attn_config.%s has layer %d, want 1..%d", prefix, l.name, L, info.NumLayers)
			}
			if kind[L-1] != 0 {
				return nil, fmt.Errorf("%slinear_attn_config.%s: layer %d is listed twice", prefix, l.name, L)
			}
			kind[L-1] = l.k
		}
	}
	for L, k := range kind {
		switch k {
		case 'm':
			info.MLALayers = append(info.MLALayers, L)
		case 'k':
			info.KDALayers = append(info.KDALayers, L)
		default:
			return nil, fmt.Errorf("%slinear_attn_config: layer %d (1-based) is in neither full_attn_layers nor kda_layers", prefix, L+1)
		}
	}
	const latentBytes = 2 // bf16 rows: the state contract
	last := info.NumLayers - 1
	info.Shape = router.ShapeOf(len(info.MLALayers), len(info.KDALayers), kvLora, rope, latentBytes, heads, headDim, conv,
		slices.Contains(info.MLALayers, last))
	info.mlaRow = int64((kvLora + rope) * latentBytes)
	info.kdaFixed = int64(heads*headDim*headDim*4 + 3*heads*headDim*(conv-1)*4)
	return info, nil
}

// StateBytes is the decode state of a sequence of tokens tokens on layers
// [lo, hi): what a decode rank holding those layers reserves for it (bf16
// MLA rows, fp32 KDA state and conv tails).
func (m *Info) StateBytes(lo, hi, tokens int) int64 {
	var mla, kda int64
	for _, L := range m.MLALayers {
		if L >= lo && L < hi {
			mla++
		}
	}
	for _, L := range m.KDALayers {
		if L >= lo && L < hi {
			kda++
		}
	}
	return mla*m.mlaRow*int64(tokens) + kda*m.kdaFixed
}

// MaxTokens is the longest sequence whose state on layers [lo, hi) fits in
// budget bytes, at most MaxPositions; a budget of 0 means unlimited.
func (m *Info) MaxTokens(lo, hi int, budget int64) int {
	if budget <= 0 {
		return m.MaxPositions
	}
	fixed := m.StateBytes(lo, hi, 0)
	per := m.StateBytes(lo, hi, 1) - fixed
	switch {
	case budget < fixed:
		return 0
	case per == 0:
		return m.MaxPositions
	}
	return int(min(int64(m.MaxPositions), (budget-fixed)/per))
}
