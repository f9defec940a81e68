package main

import (
	"fmt"

	"github.com/tandem-inference/tandem/bench/report"
	"github.com/tandem-inference/tandem/bench/sim"
)

// simTensor is one layout's projected decode.
type simTensor struct {
	Pipeline     int     `json:"pipeline"`
	Tensor       int     `json:"tensor"`
	Streams      int     `json:"streams"`
	StepMS       float64 `json:"step_ms"`
	ReadMS       float64 `json:"read_ms"`
	CollectiveMS float64 `json:"collective_ms"`
	HopMS        float64 `json:"hop_ms"`
	TokPerS      float64 `json:"tok_s"`
}

// tensorLayouts are the splits of the four Macs the projection compares.
var tensorLayouts = []sim.TensorLayout{{Pipeline: 4, Tensor: 1}, {Pipeline: 2, Tensor: 2}, {Pipeline: 1, Tensor: 4}}

// tensorLink is the mesh link between the Macs the collective is priced on.
const tensorLink = "tb5-rdma"

// tensorDecode projects one and 16 streams' decode on each layout.
func (r *simRun) tensorDecode() error {
	g := r.macs.Decode
	lp, err := sim.LoadProfile(tensorLink)
	if err != nil {
		return err
	}
	if lp.Link == nil || g == nil || g.Ranks < 1 {
		return fmt.Errorf("sim: the tensor projection needs a decode group and the %s link", tensorLink)
	}
	tc := sim.NewTensorCost(r.m, g.DecodeStepMS, g.Ranks, lp.Link.GBps, lp.Link.RTTUS)
	for _, l := range tensorLayouts {
		if l.Pipeline*l.Tensor != g.Ranks {
			continue
		}
		for _, n := range []int{1, 16} {
			p := tc.Step(l, n)
			r.out.Tensor = append(r.out.Tensor, simTensor{Pipeline: l.Pipeline, Tensor: l.Tensor, Streams: n, StepMS: round3(p.StepMS),
				ReadMS: round3(p.ReadMS), CollectiveMS: round3(p.CollectiveMS), HopMS: round3(p.HopMS), TokPerS: round3(p.TokPerS)})
		}
	}
	return nil
}

// tensorTable shows the projection.
func tensorTable(model, group string, ps []simTensor) *report.Table {
	t := &report.Table{Title: fmt.Sprintf("Decode by layout, pipeline x tensor (%s on %s)", model, group),
		Header: []string{"layout", "streams", "step", "weight reads", "all-reduces", "stage hops", "tok/s"}}
	for _, p := range ps {
		t.Addf([]string{"%s", "%d", "%.1f ms", "%.1f ms", "%.1f ms", "%.2f ms", "%.1f"}, fmt.Sprintf("%d x %d", p.Pipeline, p.Tensor), p.Streams,
			p.StepMS, p.ReadMS, p.CollectiveMS, p.HopMS, p.TokPerS)
	}
	t.Notes = []string{"Each Mac reads its share of a step's weights (rank.TensorBytes: split tensors 1/T, replicated ones whole, its routed experts; rows routed independently) at one Mac's rate, fitted so that the profile's one-stream step has all Macs reading at once, as the published K3 figures assume. The all-reduces (two per layer and one for the greedy candidates, direct exchange) and the stage hops are priced at the " + tensorLink + " profile's one-way latency (half its round trip) plus the bytes at its rate. 16 streams run as one micro-batch per stage in flight."}
	return t
}
