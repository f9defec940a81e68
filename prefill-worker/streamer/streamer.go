package streamer

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/kernels"
)

// IOMode chooses how shards are read.
type IOMode int

const (
	// IOAuto uses direct I/O where the filesystem accepts it and buffered
	// reads otherwise.
	IOAuto IOMode = iota
	// IODirect requires direct I/O (New fails without it).
	IODirect
	// IOBuffered reads through the page cache with read-ahead hints.
	IOBuffered
)

// ParseIOMode reads "auto", "direct" or "buffered".
func ParseIOMode(s string) (IOMode, error) {
	switch s {
	case "auto", "":
		return IOAuto, nil
	case "direct":
		return IODirect, nil
	case "buffered":
		return IOBuffered, nil
	}
	return 0, fmt.Errorf("I/O mode %q: want auto, direct or buffered", s)
}

// Defaults for Options.
const (
	DefaultReadSize = 8 << 20
	DefaultReaders  = 4
)

// Options configure a streamer.
type Options struct {
	// Slots is the number of layer buffers in the ring: the deepest pass it
	// can run has depth Slots-1. At least 1.
	Slots int
	// ReadSize is the largest single read request (rounded down to the
	// alignment; default DefaultReadSize); Readers how many requests are in
	// flight at once (default DefaultReaders).
	ReadSize int64
	Readers  int
	IO       IOMode
	Log      *zap.Logger
}

// Streamer owns the staging ring and runs passes over the layers, one pass
// at a time.
type Streamer struct {
	lay    *Layout
	be     kernels.Backend
	opt    Options
	direct bool
	slots  []*Slot
	reqs   [][]request // per layer, precomputed
	busy   atomic.Bool
	closed bool
}

// request is one positioned read: n bytes of file at off into the slot at
// bufOff, of which the first need must exist. It travels by value.
type request struct {
	slot        *Slot
	layer, file int
	off, bufOff int64
	n, need     int64
}

// New allocates the ring on the backend and decides the I/O mode by probing
// the first shard.
func New(lay *Layout, be kernels.Backend, opt Options) (*Streamer, error) {
	if opt.Slots < 1 {
		return nil, fmt.Errorf("streamer: %d slots; need at least 1", opt.Slots)
	}
	if opt.ReadSize <= 0 {
		opt.ReadSize = DefaultReadSize
	}
	a := int64(lay.Align)
	opt.ReadSize = max(a, opt.ReadSize/a*a)
	if opt.Readers <= 0 {
		opt.Readers = DefaultReaders
	}
	if opt.Log == nil {
		opt.Log = zap.NewNop()
	}
	s := &Streamer{lay: lay, be: be, opt: opt}
	if err := s.chooseIO(); err != nil {
		return nil, err
	}
	for i := 0; i < opt.Slots; i++ {
		buf, err := be.AllocHost(int(lay.SlotBytes))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("streamer: allocating slot %d of %d bytes: %w", i, lay.SlotBytes, err)
		}
		s.slots = append(s.slots, &Slot{buf: buf, ready: make(chan struct{}, 1)})
	}
	for L := range lay.Layers {
		s.layerRequests(L)
	}
	return s, nil
}

// chooseIO opens the first shard for direct I/O and reads one aligned block;
// if either fails, the streamer reads buffered (unless IODirect).
func (s *Streamer) chooseIO() error {
	if s.opt.IO == IOBuffered || len(s.lay.Files) == 0 {
		s.opt.Log.Info("weight streamer reads buffered, with sequential and will-need hints", zap.String("io", "buffered"))
		return nil
	}
	path := s.lay.Files[0]
	err := probeDirect(s.be, path, s.lay.Align)
	if err == nil {
		s.direct = true
		s.opt.Log.Info("weight streamer reads with direct I/O", zap.String("io", directIO),
			zap.Int("align", s.lay.Align), zap.Int64("read_size", s.opt.ReadSize), zap.Int("readers", s.opt.Readers))
		return nil
	}
	if s.opt.IO == IODirect {
		return fmt.Errorf("streamer: direct I/O (%s) on %s: %w", directIO, path, err)
	}
	s.opt.Log.Warn("direct I/O is not available; reading buffered with sequential and will-need hints (read rates include the page cache)",
		zap.String("file", path), zap.Error(err))
	return nil
}

func probeDirect(be kernels.Backend, path string, align int) error {
	f, err := openFile(path, true)
	if err != nil {
		return err
	}
	defer f.Close()
	buf, err := be.AllocHost(align)
	if err != nil {
		return err
	}
	defer be.FreeHost(buf)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// Direct reports whether the streamer reads with direct I/O.
func (s *Streamer) Direct() bool { return s.direct }

// IOName names the I/O mode for logs and reports.
func (s *Streamer) IOName() string {
	if s.direct {
		return "direct (" + directIO + ")"
	}
	return "buffered"
}

// Layout returns the layout the streamer reads by.
func (s *Streamer) Layout() *Layout { return s.lay }

// Slots is the ring size; the deepest pass has depth Slots()-1.
func (s *Streamer) Slots() int { return len(s.slots) }

// Close frees the ring. No pass may be running.
func (s *Streamer) Close() {
	if s.closed {
		return
	}
	s.closed = true
	for _, sl := range s.slots {
		s.be.FreeHost(sl.buf)
		sl.buf = nil
	}
}

// layerRequests returns layer L's requests, computed on first use and kept:
// every pass reuses them with only the slot filled in.
func (s *Streamer) layerRequests(L int) []request {
	if s.reqs == nil {
		s.reqs = make([][]request, len(s.lay.Layers))
	}
	if s.reqs[L] == nil {
		ll := &s.lay.Layers[L]
		for _, e := range ll.Extents {
			for off := int64(0); off < e.Len; off += s.opt.ReadSize {
				n := min(s.opt.ReadSize, e.Len-off)
				need := min(n, e.Need-off)
				if need <= 0 {
					break // the padding past the last tensor needs no read
				}
				s.reqs[L] = append(s.reqs[L], request{layer: L, file: e.File, off: e.Off + off,
					bufOff: e.Buf + off, n: n, need: need})
			}
		}
	}
	return s.reqs[L]
}
