package costmodel

import (
	"math"

	"github.com/tandem-inference/tandem/internal/modelconfig"
)

// Model is what the cost model needs of a model, from its configuration
// alone: the work of a prompt's positions per term, and the decode state a
// sequence moves between the boxes.
type Model struct {
	// Layers is the number of decoder layers (layer calls per pass or
	// chunk).
	Layers int
	Shape  Shape

	perToken FLOPs   // linear terms over every layer, per position
	perPair  float64 // attention over every MLA layer, per causal pair
	// The same per layer: what a pipeline stage holding some layers does.
	layerToken []FLOPs
	layerPair  []float64

	// Vision is the vision tower's sizes; nil when the model has none.
	Vision *Vision
}

// Shape is what a sequence's state costs to move: per cached token (MLA
// latent rows over all MLA layers) and per sequence (KDA state and conv
// tails), and the same for the last layer alone, which is what is left to
// send when prefill ends.
type Shape struct {
	StateBytesPerToken     float64
	StateBytesFixed        float64
	LastLayerBytesPerToken float64
	LastLayerBytesFixed    float64
}

// New derives the model's costs from its configuration; latentBytes is the
// size of one element of the MLA latent rows on the wire (2: BF16, the
// state contract).
func New(c *modelconfig.Config, latentBytes int) *Model {
	m := &Model{Layers: c.NumLayers, layerToken: make([]FLOPs, c.NumLayers), layerPair: make([]float64, c.NumLayers)}
	if v, ok := VisionOf(c); ok {
		m.Vision = &v
	}
	for L := 0; L < c.NumLayers; L++ {
		f := LayerFLOPs(c, L, 0, 1)
		f.Attn = 0
		m.perToken = m.perToken.Add(f)
		m.layerToken[L] = f
		if c.LayerKind(L) == modelconfig.MLA {
			m.perPair += attnPerPair(c)
			m.layerPair[L] = attnPerPair(c)
		}
	}
	row := float64(c.LatentWidth() * latentBytes)
	kda := float64(c.KDAHeads*c.KDAHeadDim*c.KDAHeadDim*4 + 3*c.KDAProjDim()*(c.ConvKernel-1)*4)
	for L := 0; L < c.NumLayers; L++ {
		if c.LayerKind(L) == modelconfig.MLA {
			m.Shape.StateBytesPerToken += row
		} else {
			m.Shape.StateBytesFixed += kda
		}
	}
	if c.LayerKind(c.NumLayers-1) == modelconfig.MLA {
		m.Shape.LastLayerBytesPerToken = row
	} else {
		m.Shape.LastLayerBytesFixed = kda
	}
	return m
}

// Work is the work of every layer over positions [lo, hi) of one sequence
// (the earlier ones cached): PromptFLOPs, in constant time.
func (m *Model) Work(lo, hi int) FLOPs {
	if hi <= lo {
		return FLOPs{}
	}
	f := m.perToken.Scale(float64(hi - lo))
	f.Attn = m.perPair * pairs(lo, hi)
	return f
}

// StageWork is the work of layers [first, end) over positions [lo, hi) of
// one sequence: a pipeline stage's share of Work(lo, hi).
func (m *Model) StageWork(first, end, lo, hi int) FLOPs {
	var f FLOPs
	if hi <= lo {
		return f
	}
	for L := max(first, 0); L < min(end, m.Layers); L++ {
		f = f.Add(m.layerToken[L].Scale(float64(hi - lo)))
		f.Attn += m.layerPair[L] * pairs(lo, hi)
	}
	return f
}

// StateBytes is a whole sequence's state after tokens positions.
func (s Shape) StateBytes(tokens int) float64 {
	return s.StateBytesFixed + s.StateBytesPerToken*float64(tokens)
}

// LastLayerBytes is the last layer's state after tokens positions.
func (s Shape) LastLayerBytes(tokens int) float64 {
	return s.LastLayerBytesFixed + s.LastLayerBytesPerToken*float64(tokens)
}

// Seed is the rates of a machine known only by a prefill rate: equal rates
// per term, no fixed cost, such that a prompt of tokens tokens takes
// tokens/tokPerS. Zero when tokPerS or tokens is not positive.
func (m *Model) Seed(tokPerS float64, tokens int) Compute {
	if !(tokPerS > 0) || tokens <= 0 || math.IsInf(tokPerS, 0) {
		return Compute{}
	}
	w := m.Work(0, tokens).Total()
	return Uniform(w/1e9*tokPerS/float64(tokens), 0)
}
