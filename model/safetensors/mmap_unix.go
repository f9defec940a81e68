//go:build linux || darwin

package safetensors

import (
	"fmt"
	"math"
	"os"
	"syscall"
)

// canMap tells whether Bytes returns views of mapped shards.
const canMap = true

// mapFile maps a whole shard read-only. The pages are shared with the page
// cache, so a view costs no copy and no memory of its own.
func mapFile(f *os.File, size int64) ([]byte, error) {
	if size <= 0 || size > math.MaxInt {
		return nil, fmt.Errorf("cannot map a file of %d bytes", size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return b, nil
}

// lockPages faults b's pages in and locks them in memory (mlock); the
// lock ends with the mapping.
func lockPages(b []byte) error {
	if err := syscall.Mlock(b); err != nil {
		return fmt.Errorf("mlock: %w", err)
	}
	return nil
}

func unmapFile(b []byte) error {
	if err := syscall.Munmap(b); err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return nil
}
