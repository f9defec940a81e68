// Package vision is Kimi K3's image encoder: MoonViT-V2 (patch embedding,
// a learned position table resampled to the image's patch grid, pre-norm
// blocks with 2-D rotary attention inside each image, a final norm) and the
// patchmergerv2 projector that turns each 2x2 group of patches into one row
// of the text tower's width. It runs on a kernels.Backend: the projections
// are the backend's MatMul over the checkpoint's BF16 weights in place, the
// norms its RMSNorm. The ops the Backend interface has no entry for (GELU,
// 2-D rotary embedding, softmax of non-causal attention, bilinear
// resampling, the merge's permutation) run here on the host over values
// moved with Upload and Download; a device backend would add them as ops.
//
// docs/K3.md, "Vision tower", says what each step computes and where each
// constant comes from. Callers convert decoded images (package media) into
// Patches; this package knows nothing of image files.
package vision
