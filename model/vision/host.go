package vision

import (
	"sync"

	"github.com/tandem-inference/tandem/kernels"
)

// parallelRows runs fn over [0, n) in contiguous chunks on up to threads
// goroutines: the host ops here are independent per row.
func parallelRows(threads, n int, fn func(lo, hi int)) {
	threads = max(1, min(threads, n))
	if threads == 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	per := (n + threads - 1) / threads
	for lo := 0; lo < n; lo += per {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, min(lo+per, n))
	}
	wg.Wait()
}

// download copies a backend tensor's values to a new host slice.
func download(be kernels.Backend, t *kernels.Tensor) []float32 {
	out := make([]float32, t.Rows*t.Cols)
	be.Download(out, t)
	return out
}

// upload makes a backend tensor [rows, cols] holding vals.
func upload(be kernels.Backend, vals []float32, rows, cols int) *kernels.Tensor {
	t := be.NewTensor(rows, cols)
	be.Upload(t, vals)
	return t
}
