// Package mxfp decodes and encodes the narrow float formats of Kimi K3's
// checkpoints: OCP Microscaling MXFP4 (E2M1 elements, compressed-tensors
// "mxfp4-pack-quantized" byte layout) and MXFP8 (E4M3 or E5M2 elements), both
// with one E8M0 scale per 32 consecutive elements of a row, plus the FP8,
// BF16 and F16 scalar conversions (K3-SPEC sections 5.4 and 5.4b).
//
// Dequantization is bit-exact: every decoded weight is the correctly rounded
// float32 of element x 2^(scale-127). DotMXFP4 and DotMXFP8 multiply a
// quantized row by a float32 vector without materializing the row; they apply
// each block's scale once to the block's partial sum, which is exact in the
// normal range because the scale is a power of two. Their summation order is
// fixed and every product is rounded before it is added (Go would fuse them
// on arm64), so they give the same bits on every architecture.
//
// Row functions panic when the slice lengths disagree (len(dst) = 2 x
// len(packed) = 32 x len(scales)): that is a caller bug, not bad data.
// Checkpoint shapes are validated before rows reach these functions.
package mxfp
