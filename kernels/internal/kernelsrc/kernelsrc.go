// Package kernelsrc holds kernel source text shared by the device
// dialects: numerics.h, the scalar numerics that kernels/cuda/src includes
// by path and kernels/metal embeds into the library it compiles at run time.
package kernelsrc

import _ "embed"

// Numerics is numerics.h.
//
//go:embed numerics.h
var Numerics string
