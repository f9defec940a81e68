// Package streamer reads a checkpoint's decoder layers from disk, one layer
// after another, into a ring of reusable staging buffers that runs a fixed
// number of layers ahead of compute.
//
// Each layer's bytes are the coalesced file runs of the per-layer index
// (model.LayerRuns), widened to the direct-I/O alignment and laid out back to
// back in a slot. Runs are split into large aligned requests that several
// reader goroutines issue concurrently with positioned reads. Where the
// filesystem allows it the files are opened for direct I/O (O_DIRECT on
// Linux, F_NOCACHE on macOS), so the page cache neither inflates the read
// rate nor takes memory from the budget; elsewhere the streamer falls back to
// buffered reads with sequential/will-need hints and says so in its log.
//
// Slots come from kernels.Backend.AllocHost once, when the streamer is
// created: page-aligned, and pinned on device backends so that binding a
// layer copies from the slot by DMA with no intermediate copy. A pass
// allocates nothing per layer: requests travel by value over channels and
// buffers are reused. Shard files are opened when a pass first needs them
// and closed when it ends, so that a shard deleted or replaced between (or
// during) passes is noticed.
package streamer
