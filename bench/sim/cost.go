package sim

import (
	"time"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/model"
)

// FLOPs is the cost model's work per term (costmodel.FLOPs).
type FLOPs = costmodel.FLOPs

// LayerFLOPs is costmodel.LayerFLOPs for a model configuration.
func LayerFLOPs(c *model.Config, L, lo, hi int) FLOPs {
	return costmodel.LayerFLOPs(&c.Config, L, lo, hi)
}

// PromptFLOPs is costmodel.PromptFLOPs for a model configuration.
func PromptFLOPs(c *model.Config, lo, hi int) FLOPs { return costmodel.PromptFLOPs(&c.Config, lo, hi) }

// seconds converts, saturating far beyond any simulated time.
func seconds(s float64) time.Duration {
	if !(s < 1e9) {
		return time.Duration(1e9 * float64(time.Second))
	}
	return time.Duration(s * float64(time.Second))
}

// withOverhead is c with a fixed cost of ms milliseconds per layer call.
func withOverhead(c Compute, ms float64) Compute {
	c.Layer = seconds(ms / 1e3)
	return c
}
