package cpu

import (
	"math"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
)

// decodeRow writes row r of w as fp32 into dst (len w.Cols).
func decodeRow(dst []float32, w *kernels.Matrix, r int) {
	rb := w.Format.RowBytes(w.Cols)
	row := w.Data[r*rb : (r+1)*rb]
	switch w.Format {
	case kernels.F32:
		copy(dst, f32view(row))
	case kernels.BF16:
		u := u16view(row)
		dst = dst[:len(u)]
		for i, v := range u {
			dst[i] = bf16(v)
		}
	default:
		decodeRowMX(dst, w, r, row)
	}
}

// bf16 widens a bfloat16 bit pattern to fp32 (exact).
func bf16(v uint16) float32 { return math.Float32frombits(uint32(v) << 16) }

func f32view(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func u16view(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}
