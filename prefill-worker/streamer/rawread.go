package streamer

import (
	"context"
	"fmt"
	"os"
	"time"
)

// RawRead is the baseline a pass's read rate is judged against: a plain
// sequential read of the same byte ranges of the same files in the same I/O
// mode, one request of the streamer's read size at a time, into one buffer,
// with nothing else running. It returns the bytes read and the time taken.
func (s *Streamer) RawRead(ctx context.Context) (int64, time.Duration, error) {
	if !s.busy.CompareAndSwap(false, true) {
		return 0, 0, ErrBusy
	}
	defer s.busy.Store(false)
	buf := s.slots[0].buf
	files := make([]*os.File, len(s.lay.Files))
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	var total int64
	t0 := time.Now()
	for L, ll := range s.lay.Layers {
		for _, e := range ll.Extents {
			if files[e.File] == nil {
				f, err := openFile(s.lay.Files[e.File], s.direct)
				if err != nil {
					return total, 0, &ReadError{Layer: L, File: s.lay.Files[e.File], Offset: -1, Err: err}
				}
				files[e.File] = f
			}
			for off := int64(0); off < e.Need; off += s.opt.ReadSize {
				if err := ctx.Err(); err != nil {
					return total, 0, err
				}
				n := min(s.opt.ReadSize, e.Len-off)
				got, err := files[e.File].ReadAt(buf[:n], e.Off+off)
				total += int64(got)
				if int64(got) < min(n, e.Need-off) {
					return total, 0, &ReadError{Layer: L, File: s.lay.Files[e.File], Offset: e.Off + off, Err: fmt.Errorf("short read of %d bytes: %v", got, err)}
				}
			}
		}
	}
	return total, time.Since(t0), nil
}
