package streamer

import (
	"errors"
	"fmt"
)

// ErrTruncated is wrapped when a shard is shorter than a layer needs.
var ErrTruncated = errors.New("shard is shorter than the checkpoint header says (truncated?)")

// ErrBusy is returned by Start while another pass holds the ring.
var ErrBusy = errors.New("streamer: a pass is already running")

// ReadError reports a failure to read one layer's bytes from one file.
type ReadError struct {
	Layer  int
	File   string
	Offset int64 // file offset of the failed request, -1 when opening
	Err    error
}

func (e *ReadError) Error() string {
	if e.Offset < 0 {
		return fmt.Sprintf("layer %d: opening %s: %v", e.Layer, e.File, e.Err)
	}
	return fmt.Sprintf("layer %d: reading %s at byte %d: %v", e.Layer, e.File, e.Offset, e.Err)
}

func (e *ReadError) Unwrap() error { return e.Err }
