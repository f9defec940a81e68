//go:build darwin

package streamer

import (
	"os"

	"golang.org/x/sys/unix"
)

const directIO = "F_NOCACHE"

// openFile opens a shard for reading; direct turns the unified buffer cache
// off for the file (macOS has no O_DIRECT).
func openFile(path string, direct bool) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if direct {
		if _, err := unix.FcntlInt(f.Fd(), unix.F_NOCACHE, 1); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// willNeed is a no-op: macOS reads ahead sequential files by itself.
func willNeed(*os.File, int64, int64) {}
