// Package sink holds where the prefill worker puts each sequence's state,
// layer by layer: a bounded Queue in front of any model.LayerSink (the
// backpressure point between a pass and a slow consumer), a File sink that
// writes the state in the model's stable binary encoding (for debugging,
// benchmarks and the standalone binary), and a Memory sink (for tests and
// in-process use). kvtransfer's sender is the production LayerSink.
package sink
