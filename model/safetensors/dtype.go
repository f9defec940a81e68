package safetensors

// DType is a safetensors element type, as spelled in the header.
type DType string

// The element types this package knows. F8_E8M0 (one-byte power-of-two
// scales) is accepted besides the plain U8 that compressed-tensors uses.
const (
	BOOL   DType = "BOOL"
	U8     DType = "U8"
	I8     DType = "I8"
	U16    DType = "U16"
	I16    DType = "I16"
	U32    DType = "U32"
	I32    DType = "I32"
	U64    DType = "U64"
	I64    DType = "I64"
	F16    DType = "F16"
	BF16   DType = "BF16"
	F32    DType = "F32"
	F64    DType = "F64"
	F8E4M3 DType = "F8_E4M3"
	F8E5M2 DType = "F8_E5M2"
	F8E8M0 DType = "F8_E8M0"
)

// Size returns the bytes per element, or 0 for a dtype this package does not
// know.
func (d DType) Size() int {
	switch d {
	case BOOL, U8, I8, F8E4M3, F8E5M2, F8E8M0:
		return 1
	case U16, I16, F16, BF16:
		return 2
	case U32, I32, F32:
		return 4
	case U64, I64, F64:
		return 8
	}
	return 0
}

// IsFloat reports whether d holds floating-point values a dense weight may
// be stored in (F8_E8M0 holds only scales and is not one of them).
func (d DType) IsFloat() bool {
	switch d {
	case F16, BF16, F32, F64, F8E4M3, F8E5M2:
		return true
	}
	return false
}
