package cpu

import (
	"fmt"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/mxfp"
)

// Free is a no-op: the collector reclaims host tensors.
func (b *Backend) Free(*kernels.Tensor) {}

// CopyBlock copies a block row by row; copy has memmove semantics, so a
// block moved up within one tensor (dr <= sr) is safe.
func (b *Backend) CopyBlock(dst *kernels.Tensor, dr, dc int, src *kernels.Tensor, sr, sc, rows, cols int) {
	if rows < 0 || cols < 0 || dr < 0 || dc < 0 || sr < 0 || sc < 0 ||
		dr+rows > dst.Rows || dc+cols > dst.Cols || sr+rows > src.Rows || sc+cols > src.Cols {
		panic(fmt.Sprintf("cpu.CopyBlock: %dx%d from (%d,%d) of %v to (%d,%d) of %v", rows, cols, sr, sc, src, dr, dc, dst))
	}
	if dst == src && dr > sr && rows > 0 {
		// Moving rows down would overwrite rows still to be read.
		for r := rows - 1; r >= 0; r-- {
			copy(dst.Data[(dr+r)*dst.Cols+dc:][:cols], src.Data[(sr+r)*src.Cols+sc:][:cols])
		}
		return
	}
	for r := 0; r < rows; r++ {
		copy(dst.Data[(dr+r)*dst.Cols+dc:][:cols], src.Data[(sr+r)*src.Cols+sc:][:cols])
	}
}

// AttachState views the host array as a tensor: ops update the state's
// own bytes in place.
func (b *Backend) AttachState(host []float32, rows, cols int) *kernels.Tensor {
	if len(host) != rows*cols {
		panic(fmt.Sprintf("cpu.AttachState: %d values for [%d, %d]", len(host), rows, cols))
	}
	return &kernels.Tensor{Rows: rows, Cols: cols, Data: host}
}

// DetachState copies back only when the tensor is not a view of host.
func (b *Backend) DetachState(t *kernels.Tensor, host []float32) {
	if len(host) > 0 && len(t.Data) > 0 && unsafe.SliceData(host) == unsafe.SliceData(t.Data) {
		return
	}
	copy(host, t.Data)
}

// AttachLatent and DetachLatent are no-ops: ops read and write the host
// slices directly.
func (b *Backend) AttachLatent(*kernels.LatentCache, int) {}
func (b *Backend) DetachLatent(*kernels.LatentCache, int) {}

// WriteLatent stores rows in the cache's dtype (BF16 rounded to nearest
// even, as the state contract defines).
func (b *Backend) WriteLatent(c *kernels.LatentCache, row int, src *kernels.Tensor, srcRow, n int) {
	w := c.Cols
	if src.Cols != w || row < 0 || row+n > c.Rows || srcRow < 0 || srcRow+n > src.Rows {
		panic(fmt.Sprintf("cpu.WriteLatent: %d rows from %d of %v into rows %d.. of a [%d, %d] cache", n, srcRow, src, row, c.Rows, w))
	}
	vals := src.Data[srcRow*w : (srcRow+n)*w]
	switch {
	case c.F32 != nil:
		copy(c.F32[row*w:], vals)
	case c.BF16 != nil:
		dst := c.BF16[row*w:]
		for i, v := range vals {
			dst[i] = mxfp.F32ToBF16(v)
		}
	default:
		panic("cpu.WriteLatent: cache has neither F32 nor BF16 storage")
	}
}
