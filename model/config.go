// Package model is Kimi K3's text tower: its configuration, its weights bound
// to the released checkpoint names, the decoder layers (KDA, gated NoPE MLA,
// dense SiTU FFN, Stable LatentMoE, Attention Residuals) written against a
// kernels.Backend, and the per-sequence state that prefill hands to decode.
//
// Section numbers in comments refer to the K3 specification the code was written from
// (the released config.json and modeling code); docs/ARCHITECTURE.md says what
// the code relies on.
package model

import "github.com/tandem-inference/tandem/internal/modelconfig"

// The configuration lives in internal/modelconfig, so that the coordinator
// validates config.json exactly as the workers do without importing the
// model's math.
type (
	// QuantConfig tells how routed experts are stored.
	QuantConfig = modelconfig.QuantConfig
	// LayerKind tells which attention a decoder layer uses.
	LayerKind = modelconfig.LayerKind
)

// Config is the text configuration the math needs (spec §2), with the
// state constructors the model adds to it.
type Config struct{ modelconfig.Config }

const (
	KDA = modelconfig.KDA // Kimi Delta Attention (linear, recurrent state)
	MLA = modelconfig.MLA // gated NoPE multi-head latent attention (latent KV cache)

	DefaultRMSNormEps    = modelconfig.DefaultRMSNormEps
	DefaultLatentNormEps = modelconfig.DefaultLatentNormEps
	DefaultQKNormEps     = modelconfig.DefaultQKNormEps
)

// LoadConfig reads and validates config.json at path.
func LoadConfig(path string) (*Config, error) { return wrap(modelconfig.Load(path)) }

// ParseConfig parses a released (nested) or flat text config and validates it.
func ParseConfig(b []byte) (*Config, error) { return wrap(modelconfig.Parse(b)) }

func wrap(c *modelconfig.Config, err error) (*Config, error) {
	if err != nil {
		return nil, err
	}
	return &Config{*c}, nil
}
