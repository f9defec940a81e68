// Package modelinfo is what the control plane needs to know about a model,
// read from its config.json without the model package (and so without the
// kernels): the layer count, the vocabulary, the longest sequence, the
// shape of the decode state the router prices, and an identity that every
// process serving the same model computes alike.
package modelinfo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/internal/modelconfig"
)

// ConfigFile is the model configuration's file name in a model directory.
const ConfigFile = "config.json"

// Info describes a model to the coordinator.
type Info struct {
	// ID identifies the model (see Identity): workers of one job must have
	// one, and the coordinator's must Match theirs.
	ID           string
	NumLayers    int
	VocabSize    int
	MaxPositions int // longest sequence (prompt + output)
	EOSTokenID   int // -1 when the config names none
	// MLALayers and KDALayers are 0-based layer indices of each kind.
	MLALayers, KDALayers []int
	// Vision says the model reads images: its config.json has a
	// vision_config and, when the directory holds the checkpoint, the
	// checkpoint has the vision tower's tensors (vision_tower.*).
	Vision bool
	// Cost is what the router prices: each prompt's work per term and the
	// per-sequence decode state (bf16 MLA rows, fp32 KDA state and conv
	// tails, in Cost.Shape).
	Cost *costmodel.Model

	mlaRow, kdaFixed int64  // bytes: one token's MLA row; one KDA layer's state and conv tails
	canonical        []byte // CanonicalConfig
}

// Load reads dir/config.json and, when dir holds a checkpoint, its shard
// headers for the identity (see Identity).
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
	tensors, err := checkpointTensors(dir)
	if err != nil {
		return nil, fmt.Errorf("model info: %w", err)
	}
	info.ID = identityOf(info.canonical, tensors)
	if tensors != nil && info.Vision {
		info.Vision = slices.ContainsFunc(tensors, func(t TensorMeta) bool { return strings.HasPrefix(t.Name, "vision_tower.") })
	}
	return info, nil
}

// Parse reads a config.json's contents. It validates them as every worker
// does (internal/modelconfig), so the coordinator accepts exactly the
// configs the workers accept, within the same limits. Its identity is the
// config's alone (Load adds the checkpoint's tensors).
func Parse(config []byte) (*Info, error) {
	c, err := modelconfig.Parse(config)
	if err != nil {
		return nil, err
	}
	canonical, err := CanonicalConfig(c)
	if err != nil {
		return nil, err
	}
	info := &Info{ID: identityOf(canonical, nil), canonical: canonical, NumLayers: c.NumLayers, VocabSize: c.VocabSize, MaxPositions: c.MaxPositions,
		EOSTokenID: c.EOSTokenID, MLALayers: c.MLALayers, KDALayers: c.KDALayers, Vision: hasVisionConfig(config)}
	const latentBytes = 2 // bf16 rows: the state contract
	heads, headDim, conv := c.KDAHeads, c.KDAHeadDim, c.ConvKernel
	info.Cost = costmodel.New(c, latentBytes)
	info.mlaRow = int64(c.LatentWidth() * latentBytes)
	info.kdaFixed = int64(heads*headDim*headDim*4 + 3*heads*headDim*(conv-1)*4)
	return info, nil
}

// hasVisionConfig reports whether a config.json (already parsed once,
// so valid JSON) has a vision_config that is not null.
func hasVisionConfig(config []byte) bool {
	var top struct {
		Vision json.RawMessage `json:"vision_config"`
	}
	if json.Unmarshal(config, &top) != nil {
		return false
	}
	v := bytes.TrimSpace(top.Vision)
	return len(v) > 0 && !bytes.Equal(v, []byte("null")) && !bytes.Equal(v, []byte("{}"))
}

// StateBytes is the decode state of a sequence of tokens tokens on layers
// [lo, hi): what a decode rank holding those layers reserves for it (bf16
// MLA rows, fp32 KDA state and conv tails).
func (m *Info) StateBytes(lo, hi, tokens int) int64 {
	return m.ShardStateBytes(lo, hi, tokens, 1)
}

// ShardStateBytes is StateBytes on one of tensor ranks that split the
// layers: its slice of each KDA state, and the whole MLA rows, which every
// tensor rank holds.
func (m *Info) ShardStateBytes(lo, hi, tokens, tensor int) int64 {
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
	return mla*m.mlaRow*int64(tokens) + kda*m.kdaFixed/int64(max(tensor, 1))
}

// MaxTokens is the longest sequence whose state on layers [lo, hi) fits in
// budget bytes, at most MaxPositions; a budget of 0 means unlimited.
func (m *Info) MaxTokens(lo, hi int, budget int64) int {
	return m.MaxShardTokens(lo, hi, budget, 1)
}

// MaxShardTokens is MaxTokens on one of tensor ranks (ShardStateBytes).
func (m *Info) MaxShardTokens(lo, hi int, budget int64, tensor int) int {
	if budget <= 0 {
		return m.MaxPositions
	}
	fixed := m.ShardStateBytes(lo, hi, 0, tensor)
	per := m.ShardStateBytes(lo, hi, 1, tensor) - fixed
	switch {
	case budget < fixed:
		return 0
	case per == 0:
		return m.MaxPositions
	}
	return int(min(int64(m.MaxPositions), (budget-fixed)/per))
}
