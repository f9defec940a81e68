// Package sink holds where the prefill worker puts each sequence's state,
// layer by layer: a bounded Queue in front of any model.LayerSink (the
// backpressure point between a pass and a slow consumer), a File sink that
// writes the state in the model's stable binary encoding (for debugging,
// benchmarks and the standalone binary), a Memory sink (for tests and
// in-process use), and a Check sink that verifies each layer and keeps
// only its size (passes whose states need not be kept). kvtransfer's
// sender is the production LayerSink.
package sink
