package mesh

import (
	"fmt"
	"unsafe"

	"github.com/tandem-inference/tandem/kernels"
)

// EncodeTensors appends the tensors' values (float32 little-endian, row
// major, one after the other) to buf, downloading them from the backend.
// Every supported host is little-endian (the model package checks it), so
// the values are copied as they lie in memory.
func EncodeTensors(be kernels.Backend, buf []byte, ts ...*kernels.Tensor) []byte {
	n := 0
	for _, t := range ts {
		n += 4 * t.Rows * t.Cols
	}
	off := len(buf)
	if cap(buf)-off < n {
		nb := make([]byte, off, off+n)
		copy(nb, buf)
		buf = nb
	}
	buf = buf[:off+n]
	for _, t := range ts {
		k := t.Rows * t.Cols
		if k == 0 {
			continue
		}
		dst := unsafe.Slice((*float32)(unsafe.Pointer(&buf[off])), k)
		be.Download(dst, t)
		off += 4 * k
	}
	return buf
}

// DecodeTensors splits payload into count tensors of [rows, cols] and
// uploads them to the backend. The payload must be exactly that size.
func DecodeTensors(be kernels.Backend, payload []byte, count, rows, cols int) ([]*kernels.Tensor, error) {
	if count < 0 || rows < 0 || cols < 0 {
		return nil, fmt.Errorf("mesh: %d tensors of [%d, %d]", count, rows, cols)
	}
	want := int64(count) * int64(rows) * int64(cols) * 4
	if int64(len(payload)) != want {
		return nil, fmt.Errorf("mesh: activation payload of %d bytes, expected %d (%d tensors of [%d, %d] float32)", len(payload), want, count, rows, cols)
	}
	out := make([]*kernels.Tensor, count)
	k := rows * cols
	var host []float32
	for i := range out {
		t := be.NewTensor(rows, cols)
		out[i] = t
		if k == 0 {
			continue
		}
		src := payload[i*4*k : (i+1)*4*k]
		if t.Dev == nil && len(t.Data) == k { // host memory: fill it in place
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&t.Data[0])), 4*k), src)
			continue
		}
		if host == nil {
			host = make([]float32, k)
		}
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&host[0])), 4*k), src)
		be.Upload(t, host)
	}
	return out, nil
}
