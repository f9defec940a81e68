package model

import "context"

// LayerSink receives one sequence's decode state, layer by layer, as prefill
// finishes each layer. The prefill worker hands every layer it computes to the
// sink exactly once, in layer order, and never touches a LayerState again after
// handing it over: ownership passes to the sink. A kvtransfer sender, a file
// sink and an in-memory sink implement it.
type LayerSink interface {
	// PutLayer hands over layer ls.Layer's final state. It may block to apply
	// backpressure (a bounded queue towards a slow link) until ctx is done.
	PutLayer(ctx context.Context, ls *LayerState) error
	// Close says every layer has been handed over for a sequence of tokens
	// cached tokens, and waits until the far side has committed the state
	// (or ctx ends).
	Close(ctx context.Context, tokens int) error
	// Abort gives up on the sequence (job cancelled or failed) and releases
	// everything held for it, locally and, best effort, at the far side.
	Abort(err error)
}
