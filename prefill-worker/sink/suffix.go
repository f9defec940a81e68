package sink

import (
	"context"
	"fmt"

	"github.com/tandem-inference/tandem/model"
)

// Suffix passes each layer's state to s without the MLA rows of the first
// base tokens, which the receiver already holds (an append transfer:
// kvtransfer's SenderConfig.Base); KDA states go whole. The rows are
// sliced, not copied.
func Suffix(s model.LayerSink, base int) model.LayerSink {
	if base <= 0 {
		return s
	}
	return &suffix{LayerSink: s, base: base}
}

type suffix struct {
	model.LayerSink
	base int
}

func (x *suffix) PutLayer(ctx context.Context, ls *model.LayerState) error {
	p := ls.Part(model.PartLatent)
	if p == nil {
		return x.LayerSink.PutLayer(ctx, ls)
	}
	if len(p.Shape) != 2 || p.Shape[0] < x.base {
		return fmt.Errorf("layer %d: MLA rows %v do not extend the receiver's %d", ls.Layer, p.Shape, x.base)
	}
	row := p.Shape[1] * p.DType.Size()
	out := &model.LayerState{Layer: ls.Layer, Kind: ls.Kind, Parts: []model.Part{{Kind: p.Kind, DType: p.DType,
		Shape: []int{p.Shape[0] - x.base, p.Shape[1]}, Data: p.Data[x.base*row:]}}}
	return x.LayerSink.PutLayer(ctx, out)
}
