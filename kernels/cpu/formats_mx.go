package cpu

import (
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// decodeRowMX decodes one row of an F16 or MX-format weight. MX rows are
// dequantized exactly (E2M1/FP8 value times a power-of-two scale), so the
// fp32 values equal the format's values and every path that uses them
// agrees bit for bit.
func decodeRowMX(dst []float32, w *kernels.Matrix, r int, row []byte) {
	switch w.Format {
	case kernels.F16:
		for i, v := range u16view(row) {
			dst[i] = mxfp.F16ToF32(v)
		}
	case kernels.MXFP4, kernels.MXFP8E4M3, kernels.MXFP8E5M2:
		sb := w.Cols / kernels.MXBlock
		scales := w.Scales[r*sb : (r+1)*sb]
		if w.Format == kernels.MXFP4 {
			mxfp.DequantMXFP4(dst, row, scales)
		} else {
			mxfp.DequantMXFP8(dst, row, scales, w.Format == kernels.MXFP8E5M2)
		}
	default:
		panic(fmt.Sprintf("cpu: weight %s has unknown format %s", w.Name, w.Format))
	}
}
