package sim

import (
	"strings"

	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/synth"
)

// A decode group of Macs is bound by the weights each step reads through
// each Mac's memory. A pipeline of P stages reads a step's weights one
// stage at a time; T tensor ranks per stage read their stage's split
// weights at once (each its heads, its experts, its part of the widths;
// the replicated tensors every rank reads whole) and pay two all-reduces
// per layer (model.Shard).

// TensorLayout is a group of Pipeline stages of Tensor ranks (one Mac each).
type TensorLayout struct{ Pipeline, Tensor int }

// TensorPoint is one layout's projected decode.
type TensorPoint struct {
	Layout       TensorLayout
	Streams      int
	StepMS       float64 // one token of every stream
	ReadMS       float64 // weight reads, summed over the stages
	CollectiveMS float64 // the all-reduces, summed over the layers
	HopMS        float64 // activations between the stages
	TokPerS      float64
}

// TensorCost prices decode steps of the layouts.
type TensorCost struct {
	Read StepRead
	// share[T] is what one of T tensor ranks reads of the step's
	// non-expert tensors (the Fixed read split by rank.TensorBytes).
	share map[int]float64
	// MacBytesPerMS is one Mac's effective weight read rate.
	MacBytesPerMS float64
	// LinkBytesPerMS and OneWayMS price one message between two Macs.
	LinkBytesPerMS, OneWayMS float64
	layers                   int
	hidden, latent           int
}

// NewTensorCost fits one Mac's read rate to stepMS, a step of one stream
// with all macs Macs reading at once (the published K3 figures on four
// M3 Ultra assume that), and prices the link by gbps and its round trip.
func NewTensorCost(m *Model, stepMS float64, macs int, gbps, rttUS float64) TensorCost {
	c := m.Cfg
	tc := TensorCost{Read: NewStepRead(m), share: map[int]float64{}, layers: c.NumLayers, hidden: c.HiddenSize, latent: c.LatentDim,
		LinkBytesPerMS: gbps * 1e6, OneWayMS: rttUS / 2e3}
	tc.MacBytesPerMS = tc.Read.Bytes(1) / float64(macs) / stepMS
	plan := synth.Plan(c)
	for _, T := range []int{1, 2, 3, 4, 8} {
		s := model.Shard{Rank: 0, Ranks: T}
		var n float64
		add := func(ts []synth.Tensor) {
			for _, t := range ts {
				if strings.Contains(t.Name, ".experts.") && !strings.Contains(t.Name, "shared_experts") {
					continue
				}
				if !strings.Contains(t.Name, "embed_tokens") {
					n += float64(rank.TensorBytes(c, t.Name, t.Bytes(), s))
				}
			}
		}
		for _, ts := range plan.Layers {
			add(ts)
		}
		add(plan.Globals)
		tc.share[T] = n
	}
	return tc
}

// Step projects streams sequences' decode on layout l. One stream visits
// the stages in turn; with several, the group keeps P micro-batches of
// streams/P in flight and every stage is busy, so the rate is set by one
// stage's time per micro-batch.
func (tc TensorCost) Step(l TensorLayout, streams int) TensorPoint {
	p := TensorPoint{Layout: l, Streams: streams}
	P, T := float64(l.Pipeline), l.Tensor
	rows := streams
	if streams > 1 {
		rows = max(1, streams/l.Pipeline)
	}
	r := tc.Read
	e := float64(r.Experts)
	distinct := e * (1 - pow(1-float64(r.TopK)/e, rows))
	perRank := tc.share[T] + float64(r.MoELayers)*distinct*float64(r.Expert)/float64(T)
	stage := perRank / P / tc.MacBytesPerMS // one micro-batch on one stage
	coll := 0.0
	if T > 1 {
		// Direct exchange: each rank sends its buffer to the T-1 others on
		// links of their own; one message time per all-reduce, two per
		// layer (attention [rows, d], MLP [rows, latent + d]) and one for
		// the greedy candidates.
		msg := func(elems int) float64 { return tc.OneWayMS + float64(4*elems*rows)/tc.LinkBytesPerMS }
		coll = float64(tc.layers)*(msg(tc.hidden)+msg(tc.latent+tc.hidden)) + msg(2*T)
		coll /= P // per stage
	}
	hop := tc.OneWayMS + float64(4*tc.hidden*rows)/tc.LinkBytesPerMS // activations to the next stage
	if streams == 1 {
		p.ReadMS, p.CollectiveMS, p.HopMS = stage*P, coll*P, hop*P
		p.StepMS = p.ReadMS + p.CollectiveMS + p.HopMS
		p.TokPerS = 1e3 / p.StepMS
		return p
	}
	perMicro := stage + coll + hop
	p.StepMS = perMicro * P // every stream's token: P micro-batches through the busiest stage
	p.ReadMS, p.CollectiveMS, p.HopMS = stage*P, coll*P, hop*P
	p.TokPerS = float64(streams) / (p.StepMS / 1e3)
	return p
}

func pow(x float64, n int) float64 {
	out := 1.0
	for range n {
		out *= x
	}
	return out
}
