//go:build linux

package streamer

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// directIO names what direct I/O means on this OS, for logs.
const directIO = "O_DIRECT"

// openFile opens a shard for reading, bypassing the page cache when direct
// is set; buffered files get a sequential read-ahead hint.
func openFile(path string, direct bool) (*os.File, error) {
	flag := os.O_RDONLY
	if direct {
		flag |= syscall.O_DIRECT
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, err
	}
	if !direct {
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL) // a hint; failure changes nothing
	}
	return f, nil
}

// willNeed asks the kernel to start reading a range of a buffered file.
func willNeed(f *os.File, off, n int64) {
	_ = unix.Fadvise(int(f.Fd()), off, n, unix.FADV_WILLNEED)
}
