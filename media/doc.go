// Package media decodes user images and preprocesses them the way Kimi K3's
// released image processor does, so the vision tower sees the same numbers
// it was trained on: EXIF orientation, the scale rule (never upscale, at most
// 65,536 patches and 512 a side), Pillow's bicubic resampling, transparency
// composited over the released chessboard, black padding to multiples of 28,
// normalisation to [-1, 1], and 14x14 patches in row-major order.
//
// Every rule and its source is written down in docs/K3.md ("Image
// preprocessing"). The package knows nothing about the model; callers turn an
// Image into the tower's input.
//
// Untrusted bytes are checked by Probe, from the header alone, against Limits
// before anything the header sizes is allocated.
package media
