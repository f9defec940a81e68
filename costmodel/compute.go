package costmodel

import (
	"fmt"
	"math"
	"time"
)

// Compute is a machine's compute rate per term, in GFLOP/s (1e9 FLOP/s),
// over the FLOPs this package counts, and its fixed cost per layer call:
// what one prefill path is priced by. KDA and MLA are the attention
// sublayers' linear work, MLAAttention the MLA layers' causal attention
// over the cache (the MLA rate when 0), MoE and Dense the feed-forward
// ones. A zero rate is unknown: work at it takes Unknown.
type Compute struct {
	KDA          float64 `yaml:"kda" json:"kda"`
	MLA          float64 `yaml:"mla" json:"mla"`
	MLAAttention float64 `yaml:"mla_attention,omitempty" json:"mla_attention,omitempty"`
	MoE          float64 `yaml:"moe" json:"moe"`
	Dense        float64 `yaml:"dense" json:"dense"`
	// Layer is the fixed cost of one layer call (binding, launching, the
	// stage loop), whatever its tokens.
	Layer time.Duration `yaml:"-" json:"layer_ns,omitempty"`
}

func (c Compute) Attention() float64 {
	if c.MLAAttention > 0 {
		return c.MLAAttention
	}
	return c.MLA
}

// Known reports whether every rate is measured (positive and finite).
func (c Compute) Known() bool {
	for _, v := range []float64{c.KDA, c.MLA, c.MoE, c.Dense} {
		if !(v > 0) || math.IsInf(v, 0) {
			return false
		}
	}
	return c.MLAAttention >= 0 && !math.IsInf(c.MLAAttention, 0) && c.Layer >= 0
}

// Time is the time of work f done in calls layer calls: Unknown when a
// rate it needs is unknown.
func (c Compute) Time(f FLOPs, calls int) time.Duration {
	need := []struct{ work, rate float64 }{{f.KDA, c.KDA}, {f.MLA, c.MLA}, {f.Attn, c.Attention()}, {f.MoE, c.MoE}, {f.Dense, c.Dense}}
	for _, n := range need {
		if n.work > 0 && !(n.rate > 0) {
			return Unknown
		}
	}
	var s float64
	for _, n := range need {
		if n.work > 0 {
			s += n.work / n.rate / 1e9
		}
	}
	return seconds(s + float64(calls)*c.Layer.Seconds())
}

// Uniform is the rates of a machine that does every term at gflops and
// pays layer per layer call: a seed where only a tokens/s figure is known.
func Uniform(gflops float64, layer time.Duration) Compute {
	return Compute{KDA: gflops, MLA: gflops, MLAAttention: gflops, MoE: gflops, Dense: gflops, Layer: layer}
}

// String shows the rates briefly: "kda 21.3 mla 20.1 attn 9.2 moe 18.0
// dense 25.0 GFLOP/s, 0.21 ms/layer".
func (c Compute) String() string {
	if c == (Compute{}) {
		return "unmeasured"
	}
	return fmt.Sprintf("kda %.3g mla %.3g attn %.3g moe %.3g dense %.3g GFLOP/s, %.3g ms/layer",
		c.KDA, c.MLA, c.Attention(), c.MoE, c.Dense, float64(c.Layer)/1e6)
}
