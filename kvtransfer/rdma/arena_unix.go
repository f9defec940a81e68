//go:build unix

package rdma

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// mapArena maps n bytes of anonymous memory: page-aligned, outside the Go
// heap (the garbage collector never moves or frees it under the device).
func mapArena(n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("rdma: map a %d-byte arena: %w", n, err)
	}
	return b, nil
}

func unmapArena(b []byte) error { return unix.Munmap(b) }
