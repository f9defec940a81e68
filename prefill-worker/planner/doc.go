// Package planner decides how a layer-streamed prefill pass uses a memory
// budget: how many layers the weight streamer reads ahead of compute (the
// prefetch depth), how many token rows each layer call processes (the tile),
// and which tokens of which queued jobs go into the pass (splitting prompts
// whose activations do not fit into super-chunks that take one pass each).
//
// It is pure logic over sizes: it reads no files and allocates nothing large,
// so every decision can be unit-tested and explained before a byte is read
// (the worker's --dry-run prints the plan).
//
// The memory model. A pass holds, at its peak:
//
//	ring         (depth+1) slots of the largest layer's aligned read size
//	states       every admitted job's whole decode state (KDA state, conv
//	             tails and MLA cache rows at full prompt length), which lives
//	             until the job's last layer is handed to its sink
//	activations  per pass token: the AttnRes partial sum, the new partial at
//	             a block start and the completed block stack, all fp32 [d],
//	             plus its embedding row
//	temporaries  what one layer call allocates for a tile of rows (projections,
//	             KDA/MLA scratch, MoE routing and expert buffers, GEMM scratch),
//	             estimated from the configuration (estimate.go) and calibrated
//	             against the CPU backend by a test
//
// Super-chunk and tile boundaries fall only on multiples of model.KDAChunk
// tokens from the prompt start, so the chunked KDA sees the same chunks as a
// single call over the whole prompt and the states stay bit-identical.
package planner
