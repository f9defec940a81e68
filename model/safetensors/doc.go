// Package safetensors reads and writes checkpoints in the safetensors format:
// an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and data_offsets (relative to the data section), then the raw
// little-endian tensor bytes. A checkpoint is a directory of such shards,
// tied together by model.safetensors.index.json when it has one.
//
// Headers are treated as hostile: every length, offset and shape is checked
// against the file before it is used, and a bad one is reported as an *Error
// that names the file and the tensor. Tensor data is reached either as a
// zero-copy view of a memory-mapped shard (Bytes) or by positioned reads into
// caller memory (ReadTensor); Runs and GroupRuns give the byte ranges a
// streaming reader needs, coalesced per file.
//
// Which quantized format a weight uses is decided from the header alone (see
// Weight), never from tensor names.
package safetensors
