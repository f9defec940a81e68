package planner

import (
	"fmt"

	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/model"
)

// The device plan. A GPU backend holds in device memory, at the peak of a
// pass: the weights being computed with and those being uploaded for what
// comes next (so that upload and compute overlap), plus the pass's working
// set (activations, one layer's states of every sequence, one tile's
// temporaries). When two whole layers and the working set fit, layers are
// double-buffered. When they do not (K3's ~17 GB layers on a 32 GB card), a
// layer streams in parts: its attention block (everything but the routed
// experts) and then groups of experts, each part uploaded while the
// previous one computes, so at most two consecutive parts are resident.

// DeviceLayer is one layer's weights split the way parts stream: Attn is
// everything but the routed experts (attention, norms, router, latent
// projections, shared experts or the dense FFN), Expert one routed expert
// (w1, w3, w2 with scales) and Experts how many there are.
type DeviceLayer struct {
	Attn, Expert int64
	Experts      int
}

// Bytes is the layer's total.
func (l DeviceLayer) Bytes() int64 { return l.Attn + int64(l.Experts)*l.Expert }

// ConfigLayer derives the largest layer's split from the configuration and
// the largest layer's size (the ring slot): experts are stored as released,
// MXFP4 with one E8M0 scale per 32 values.
func ConfigLayer(c *model.Config, layerBytes int64) DeviceLayer {
	per := int64(3) * int64(c.MoEIntermediate) * int64(c.LatentDim)
	l := DeviceLayer{Expert: per/2 + per/32, Experts: c.NumExperts}
	l.Attn = max(layerBytes-int64(l.Experts)*l.Expert, 0)
	return l
}

// DeviceInput is what a device plan depends on.
type DeviceInput struct {
	// Device is the device memory the pass may use (free memory less what
	// the backend keeps for itself).
	Device int64
	Layer  DeviceLayer
	Costs  Costs
	// The pass: tokens in it, rows per layer call and sequences.
	Tokens, Tile, Seqs int
}

// DeviceMode is how weights stream through device memory.
type DeviceMode uint8

const (
	// WholeLayers: layer L+1 uploads while layer L computes.
	WholeLayers DeviceMode = iota + 1
	// LayerParts: the attention block, then groups of GroupExperts experts.
	LayerParts
)

func (m DeviceMode) String() string {
	switch m {
	case WholeLayers:
		return "whole layers, double-buffered"
	case LayerParts:
		return "layer parts: the attention block, then expert groups"
	}
	return fmt.Sprintf("DeviceMode(%d)", uint8(m))
}

// DevicePlan is the decision and its peak memory.
type DevicePlan struct {
	Mode DeviceMode
	// GroupExperts experts per uploaded part and Parts parts per layer
	// (LayerParts; WholeLayers has one part holding every expert).
	GroupExperts, Parts int
	// Weights is the peak of resident weights (two consecutive parts or
	// layers), Working the pass's working set, Total their sum.
	Weights, Working, Total, Device int64
}

// PlanDevice decides how a pass streams weights through device memory. It
// errs, saying what does not fit and what to change, when not even the
// attention block and one expert fit next to the working set.
func PlanDevice(in DeviceInput) (DevicePlan, error) {
	l := in.Layer
	if in.Device <= 0 || l.Attn < 0 || l.Expert <= 0 && l.Experts > 0 || in.Tokens <= 0 || in.Tile <= 0 || in.Seqs <= 0 {
		return DevicePlan{}, fmt.Errorf("planner: device plan of %+v", in)
	}
	c := in.Costs
	p := DevicePlan{Device: in.Device}
	p.Working = int64(in.Tokens)*c.ActPerToken + c.Temps(in.Tile, in.Seqs) + int64(in.Seqs)*c.LayerState(in.Tokens)
	hb := progress.HumanBytes
	if p.Working >= in.Device {
		return p, fmt.Errorf("%w: the pass's activations, one layer's states and temporaries (%s for %d tokens in %d sequences) exceed the device's %s: give the worker a smaller memory budget so passes hold fewer tokens",
			ErrBudget, hb(p.Working), in.Tokens, in.Seqs, hb(in.Device))
	}
	room := in.Device - p.Working
	if 2*l.Bytes() <= room {
		p.Mode, p.GroupExperts, p.Parts, p.Weights = WholeLayers, l.Experts, 1, 2*l.Bytes()
		p.Total = p.Weights + p.Working
		return p, nil
	}
	// Parts: consecutive parts are (attention, first group), (group, group)
	// and (last group, next layer's attention).
	g := min(room-l.Attn, room/2)
	per := 0
	if l.Expert > 0 {
		per = int(min(g/l.Expert, int64(l.Experts)))
	}
	if l.Experts == 0 || per < 1 {
		return p, fmt.Errorf("%w: device memory %s cannot hold the working set (%s), a layer's attention block (%s) and one expert (%s) at once: use a GPU with more memory or fewer tokens per pass",
			ErrBudget, hb(in.Device), hb(p.Working), hb(l.Attn), hb(l.Expert))
	}
	groups := (l.Experts + per - 1) / per
	p.Mode, p.GroupExperts, p.Parts = LayerParts, per, 1+groups
	grp := int64(per) * l.Expert
	p.Weights = max(l.Attn+grp, int64(min(2, groups))*grp)
	p.Total = p.Weights + p.Working
	return p, nil
}
