//go:build unix

package machine

import (
	"os"
	"slices"
	"syscall"
	"time"
)

// PageFaultMicros is what the first touch of a page of fresh anonymous
// memory costs here, in microseconds: the kernel's fault, zeroing and
// mapping, and in a virtual machine the hypervisor's share, which can be
// most of it. A process pays it for every page its heap grows into and
// for every page it touches again after returning it to the kernel. It
// maps 16 MiB three times, writes a byte to each page, and returns the
// median; ok is false where the memory cannot be mapped.
func PageFaultMicros() (us float64, ok bool) {
	const size = 16 << 20
	page := os.Getpagesize()
	var per []float64
	for range 3 {
		b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return 0, false
		}
		start := time.Now()
		for i := 0; i < size; i += page {
			b[i] = 1
		}
		el := time.Since(start)
		if err := syscall.Munmap(b); err != nil {
			return 0, false
		}
		per = append(per, float64(el.Nanoseconds())/1e3/float64(size/page))
	}
	slices.Sort(per)
	return per[1], true
}
