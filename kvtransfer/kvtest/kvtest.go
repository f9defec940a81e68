// Package kvtest provides model configs and decode states shaped like real
// ones for tests and benchmarks of kvtransfer and of the packages that use it.
// States are filled with seeded random bytes: the transfer layer moves bytes
// and must not care what they mean.
package kvtest

import (
	"bytes"
	"embed"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/model"
)

//go:embed testdata/tiny/config.json testdata/k3-release/config.json
var files embed.FS

// Own configs: the tiny config of K3-SPEC §2.2 and the released K3 config.
var ownConfigs = map[string]string{
	"tiny": "testdata/tiny/config.json",
	"k3":   "testdata/k3-release/config.json",
}

// Names lists the configs: the own ones and the synthetic presets of configs/.
func Names() []string {
	out := configs.ModelPresets()
	for n := range ownConfigs {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Config parses the config called name: "tiny" (K3-SPEC §2.2), "k3" (the
// released full-size config) or another synthetic preset of configs/
// ("small", "medium").
func Config(name string) (*model.Config, error) {
	var b []byte
	var err error
	if p, ok := ownConfigs[name]; ok {
		b, err = files.ReadFile(p)
	} else {
		b, err = configs.ModelPreset(name)
	}
	if err != nil {
		return nil, fmt.Errorf("kvtest: %w", err)
	}
	c, err := model.ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("kvtest: config %s: %w", name, err)
	}
	return c, nil
}

// RandomLayer returns layer L's state for a sequence of T cached tokens with
// the shapes the receiver expects (model.Config.ExpectedParts), filled from rng.
func RandomLayer(c *model.Config, L, T int, latent model.DType, rng *rand.ChaCha8) *model.LayerState {
	parts := c.ExpectedParts(L, T, latent)
	ls := &model.LayerState{Layer: L, Kind: c.LayerKind(L), Parts: parts}
	for i := range ls.Parts {
		p := &ls.Parts[i]
		p.Data = make([]byte, p.Elems()*p.DType.Size())
		_, _ = rng.Read(p.Data) // ChaCha8.Read never fails
	}
	return ls
}

// RandomSeq returns a state holding random layers for the given layers,
// deterministic in seed.
func RandomSeq(c *model.Config, layers []int, T int, latent model.DType, seed uint64) *model.SeqState {
	var key [32]byte
	for i := 0; i < 8; i++ {
		key[i] = byte(seed >> (8 * i))
	}
	rng := rand.NewChaCha8(key)
	s := &model.SeqState{Tokens: T, Layers: make([]*model.LayerState, c.NumLayers)}
	for _, L := range layers {
		s.Layers[L] = RandomLayer(c, L, T, latent, rng)
	}
	return s
}

// AllLayers lists 0..n-1.
func AllLayers(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// Diff reports the first difference between want's layers in layers and got,
// naming layer, part and byte offset; nil when they are byte-identical.
func Diff(want, got *model.SeqState, layers []int) error {
	if got == nil {
		return fmt.Errorf("got no state")
	}
	if want.Tokens != got.Tokens {
		return fmt.Errorf("tokens: got %d, want %d", got.Tokens, want.Tokens)
	}
	for _, L := range layers {
		w, g := want.Layers[L], got.Layers[L]
		if g == nil {
			return fmt.Errorf("layer %d: missing", L)
		}
		if g.Layer != w.Layer || g.Kind != w.Kind || len(g.Parts) != len(w.Parts) {
			return fmt.Errorf("layer %d: got layer %d kind %s with %d parts, want layer %d kind %s with %d parts",
				L, g.Layer, g.Kind, len(g.Parts), w.Layer, w.Kind, len(w.Parts))
		}
		for i := range w.Parts {
			wp, gp := &w.Parts[i], g.Part(w.Parts[i].Kind)
			if gp == nil {
				return fmt.Errorf("layer %d: part %s missing", L, wp.Kind)
			}
			if gp.DType != wp.DType || fmt.Sprint(gp.Shape) != fmt.Sprint(wp.Shape) {
				return fmt.Errorf("layer %d part %s: got %s %v, want %s %v", L, wp.Kind, gp.DType, gp.Shape, wp.DType, wp.Shape)
			}
			if len(gp.Data) != len(wp.Data) {
				return fmt.Errorf("layer %d part %s: got %d bytes, want %d", L, wp.Kind, len(gp.Data), len(wp.Data))
			}
			if !bytes.Equal(gp.Data, wp.Data) {
				off := 0
				for off < len(wp.Data) && gp.Data[off] == wp.Data[off] {
					off++
				}
				return fmt.Errorf("layer %d part %s: bytes differ from offset %d", L, wp.Kind, off)
			}
		}
	}
	for L, g := range got.Layers {
		if g != nil && !contains(layers, L) {
			return fmt.Errorf("layer %d: present but not expected", L)
		}
	}
	return nil
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
