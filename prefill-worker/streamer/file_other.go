//go:build !linux && !darwin

package streamer

import (
	"errors"
	"os"
)

const directIO = "direct I/O"

// openFile opens a shard for buffered reading; this OS has no direct I/O
// support here, so asking for it fails and the streamer falls back.
func openFile(path string, direct bool) (*os.File, error) {
	if direct {
		return nil, errors.New("direct I/O is not implemented on this OS")
	}
	return os.Open(path)
}

func willNeed(*os.File, int64, int64) {}
