//go:build unix

package rdma

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mapArena maps n bytes of anonymous memory: page-aligned, outside the Go
// heap (the garbage collector never moves or frees it under the device),
// and faulted in now, so that the first slots a link moves do not pay for
// zeroing pages.
func mapArena(n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("rdma: map a %d-byte arena: %w", n, err)
	}
	for i := 0; i < len(b); i += pageSize {
		b[i] = 0
	}
	return b, nil
}

var pageSize = os.Getpagesize()

func unmapArena(b []byte) error { return unix.Munmap(b) }
