package streamer

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"
)

// RawRead is the baseline a pass's read rate is judged against: a plain
// sequential read of the same byte ranges of the same files in the same I/O
// mode and request size, into the same ring memory, with inflight requests
// outstanding at once (1 is dd-like; the streamer's Readers is the fair
// comparison), with no layer boundaries, no slot hand-over and no compute. It returns the
// bytes read and the time taken.
func (s *Streamer) RawRead(ctx context.Context, inflight int) (int64, time.Duration, error) {
	if !s.busy.CompareAndSwap(false, true) {
		return 0, 0, ErrBusy
	}
	defer s.busy.Store(false)
	inflight = max(inflight, 1)
	files := make([]*os.File, len(s.lay.Files))
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	// Open every file first, so that opening is not timed.
	for L, ll := range s.lay.Layers {
		for _, e := range ll.Extents {
			if files[e.File] == nil {
				f, err := openFile(s.lay.Files[e.File], s.direct)
				if err != nil {
					return 0, 0, &ReadError{Layer: L, File: s.lay.Files[e.File], Offset: -1, Err: err}
				}
				files[e.File] = f
			}
		}
	}
	// Read into the ring's own memory, region after region, as a pass does:
	// on the VMs we measured, reading again and again into the same few
	// buffers was a third slower than walking the ring. Allocate only what
	// the ring cannot hold.
	size := min(s.opt.ReadSize, s.lay.SlotBytes)
	var bufs [][]byte
	for _, sl := range s.slots {
		for off := int64(0); off+size <= int64(len(sl.buf)); off += size {
			bufs = append(bufs, sl.buf[off:off+size])
		}
	}
	for len(bufs) < inflight {
		b, err := s.be.AllocHost(int(size))
		if err != nil {
			return 0, 0, err
		}
		defer s.be.FreeHost(b)
		bufs = append(bufs, b)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reqs := make(chan request, inflight)
	var (
		mu    sync.Mutex
		total int64
		first error
		wg    sync.WaitGroup
	)
	t0 := time.Now()
	// Readers take free regions in turn (a FIFO of region indices), so that
	// requests walk the ring as a pass's do and no region is written by two
	// readers at once.
	free := make(chan int, len(bufs))
	for i := range bufs {
		free <- i
	}
	for range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range reqs {
				region := <-free
				buf := bufs[region]
				got, err := files[r.file].ReadAt(buf[:r.n], r.off)
				free <- region
				mu.Lock()
				total += int64(got)
				if int64(got) < r.need && first == nil {
					first = &ReadError{Layer: r.layer, File: s.lay.Files[r.file], Offset: r.off, Err: fmt.Errorf("short read of %d bytes: %v", got, err)}
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	// The same requests as a pass, in file order, capped at the region size.
	func() {
		defer close(reqs)
		for L, ll := range s.lay.Layers {
			for _, e := range ll.Extents {
				for off := int64(0); off < e.Need; off += size {
					n := min(size, e.Len-off)
					select {
					case reqs <- request{layer: L, file: e.File, off: e.Off + off, n: n, need: min(n, e.Need-off)}:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	wg.Wait()
	d := time.Since(t0)
	if first != nil {
		return total, d, first
	}
	if err := ctx.Err(); err != nil {
		return total, d, err
	}
	return total, d, nil
}

// Readers is the number of requests a pass keeps in flight.
func (s *Streamer) Readers() int { return s.opt.Readers }
