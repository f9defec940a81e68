package sim

import (
	"math"
	"testing"
)

// TestTensorLayouts: on four Macs fitted to a 45 ms one-stream step with
// all four reading, the pipeline 4 x 1 reads a step one Mac at a time
// (four times that), tensor ranks read at once and pay all-reduces only
// when split, and a tensor rank reads more than a quarter (the replicated
// tensors) but less than the whole.
func TestTensorLayouts(t *testing.T) {
	tc := NewTensorCost(k3(t), 45, 4, 7, 30)
	pipe := tc.Step(TensorLayout{Pipeline: 4, Tensor: 1}, 1)
	if math.Abs(pipe.ReadMS-180) > 1 || pipe.CollectiveMS != 0 {
		t.Fatalf("4 x 1: %+v, want 180 ms of reads and no all-reduce", pipe)
	}
	mid := tc.Step(TensorLayout{Pipeline: 2, Tensor: 2}, 1)
	wide := tc.Step(TensorLayout{Pipeline: 1, Tensor: 4}, 1)
	if !(wide.StepMS < mid.StepMS && mid.StepMS < pipe.StepMS) || wide.CollectiveMS <= 0 {
		t.Fatalf("one stream: 4x1 %.1f ms, 2x2 %.1f, 1x4 %.1f (all-reduce %.1f)", pipe.StepMS, mid.StepMS, wide.StepMS, wide.CollectiveMS)
	}
	if wide.ReadMS <= 45 || wide.ReadMS >= 180 {
		t.Fatalf("1 x 4 reads %.1f ms: want above a quarter of the step and below the whole", wide.ReadMS)
	}
	for _, l := range []TensorLayout{{4, 1}, {2, 2}, {1, 4}} {
		if one, many := tc.Step(l, 1), tc.Step(l, 16); many.TokPerS <= one.TokPerS {
			t.Errorf("%v: 16 streams %.1f tok/s, one %.1f", l, many.TokPerS, one.TokPerS)
		}
	}
}
