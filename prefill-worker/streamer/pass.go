package streamer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-inference/tandem/model"
)

// Slot is one ring buffer holding one layer of a pass.
type Slot struct {
	buf     []byte
	layer   int
	used    int64 // bytes of buf the layer occupies
	pending atomic.Int32
	ready   chan struct{} // receives once every request of the layer has landed
	src     source
	pass    *Pass
}

// Layer is the layer the slot holds.
func (s *Slot) Layer() int { return s.layer }

// Source resolves the layer's tensors by name to views of the slot (for
// model.BindLayer). The views are valid until Release.
func (s *Slot) Source() model.TensorSource { return &s.src }

// Staging is the slot's bytes: host memory from Backend.AllocHost that a
// device backend copies the layer from.
func (s *Slot) Staging() []byte { return s.buf[:s.used] }

// Release hands the slot back to the ring for a later layer. Slots must be
// released in layer order, and nothing may use the layer's views afterwards.
func (s *Slot) Release() {
	p := s.pass
	if p == nil {
		return
	}
	s.pass = nil
	p.free <- struct{}{}
}

// Pass is one run over every layer, in order. Next returns each layer as
// soon as its bytes have landed; up to depth later layers are being read
// meanwhile.
type Pass struct {
	s      *Streamer
	ctx    context.Context
	cancel context.CancelFunc
	slots  []*Slot // the ring slots this pass uses: depth+1
	free   chan struct{}
	reqs   chan request
	files  []*os.File // opened on first use, closed by Close
	next   int        // next layer Next returns
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error // the first read error

	start    time.Time
	bytes    atomic.Int64
	lastRead atomic.Int64 // ns after start when the last request landed
	wait     time.Duration
	closed   bool

	// Reads in flight and the time at least one was: the disk's busy
	// time, apart from the time the ring was full (compute behind).
	busyMu   sync.Mutex
	inFlight int
	busyFrom time.Time
	busy     time.Duration
}

// PassStats are a pass's I/O figures.
type PassStats struct {
	// Bytes read from disk (aligned requests, up to the file end).
	Bytes int64
	// ReadWall is from the pass start until the last byte landed.
	ReadWall time.Duration
	// Wait is the time Next spent waiting for bytes (compute idle on I/O).
	Wait time.Duration
	// ReadBusy is the time at least one read was in flight: Bytes over it
	// is the read rate even when compute held the reads back (a full
	// ring), which ReadWall is not.
	ReadBusy time.Duration
}

// Start begins a pass that reads up to depth layers ahead of the one being
// consumed (the ring must have depth+1 slots). Cancelling ctx stops it.
func (s *Streamer) Start(ctx context.Context, depth int) (*Pass, error) {
	if s.closed {
		return nil, errors.New("streamer: closed")
	}
	if depth < 0 || depth >= len(s.slots) {
		return nil, fmt.Errorf("streamer: depth %d needs %d slots, the ring has %d", depth, depth+1, len(s.slots))
	}
	if !s.busy.CompareAndSwap(false, true) {
		return nil, ErrBusy
	}
	p := &Pass{s: s, slots: s.slots[:depth+1], free: make(chan struct{}, depth+1),
		reqs: make(chan request, 2*s.opt.Readers), files: make([]*os.File, len(s.lay.Files)), start: time.Now()}
	p.ctx, p.cancel = context.WithCancel(ctx)
	for range p.slots {
		p.free <- struct{}{}
	}
	p.wg.Add(1 + s.opt.Readers)
	go p.produce()
	for range s.opt.Readers {
		go p.read()
	}
	return p, nil
}

// fail records the first error and stops the pass.
func (p *Pass) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	p.cancel()
}

func (p *Pass) firstErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// produce schedules each layer's requests once a slot is free.
func (p *Pass) produce() {
	defer p.wg.Done()
	lay := p.s.lay
	for L := range lay.Layers {
		select {
		case <-p.free:
		case <-p.ctx.Done():
			return
		}
		sl := p.slots[L%len(p.slots)]
		ll := &lay.Layers[L]
		for _, e := range ll.Extents {
			if err := p.open(L, e.File); err != nil {
				p.fail(err)
				return
			}
			if !p.s.direct {
				willNeed(p.files[e.File], e.Off, e.Need)
			}
		}
		sl.layer, sl.used = L, ll.ReadBytes
		sl.src = source{ll: ll, buf: sl.buf[:ll.ReadBytes]}
		sl.pass = p
		reqs := p.s.reqs[L]
		sl.pending.Store(int32(len(reqs)))
		if len(reqs) == 0 {
			sl.ready <- struct{}{}
			continue
		}
		for _, r := range reqs {
			r.slot = sl
			select {
			case p.reqs <- r:
			case <-p.ctx.Done():
				return
			}
		}
	}
}

// open opens file f for the pass unless it is open, and checks that it is
// long enough for every layer that reads it.
func (p *Pass) open(L, f int) error {
	if p.files[f] != nil {
		return nil
	}
	path := p.s.lay.Files[f]
	fh, err := openFile(path, p.s.direct)
	if err != nil {
		return &ReadError{Layer: L, File: path, Offset: -1, Err: err}
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return &ReadError{Layer: L, File: path, Offset: -1, Err: err}
	}
	if !st.Mode().IsRegular() {
		fh.Close()
		return &ReadError{Layer: L, File: path, Offset: -1, Err: fmt.Errorf("not a regular file (%v)", st.Mode())}
	}
	if need := p.s.lay.fileNeed[f]; st.Size() < need {
		fh.Close()
		return &ReadError{Layer: p.s.lay.needLayer[f], File: path, Offset: -1,
			Err: fmt.Errorf("%w: the file is %d bytes, layer %d needs %d", ErrTruncated, st.Size(), p.s.lay.needLayer[f], need)}
	}
	p.files[f] = fh
	return nil
}

// read serves requests until the pass ends.
func (p *Pass) read() {
	defer p.wg.Done()
	for {
		var r request
		select {
		case r = <-p.reqs:
		case <-p.ctx.Done():
			return
		}
		p.readStarts()
		err := p.readOne(r)
		p.readEnds()
		if err != nil {
			p.fail(err)
			return
		}
		if r.slot.pending.Add(-1) == 0 {
			p.lastRead.Store(int64(time.Since(p.start)))
			r.slot.ready <- struct{}{}
		}
	}
}

func (p *Pass) readStarts() {
	p.busyMu.Lock()
	if p.inFlight == 0 {
		p.busyFrom = time.Now()
	}
	p.inFlight++
	p.busyMu.Unlock()
}

func (p *Pass) readEnds() {
	p.busyMu.Lock()
	p.inFlight--
	if p.inFlight == 0 {
		p.busy += time.Since(p.busyFrom)
	}
	p.busyMu.Unlock()
}

// readOne reads a request fully; a file that ends before the request's
// needed bytes is truncated.
func (p *Pass) readOne(r request) error {
	f := p.files[r.file]
	buf := r.slot.buf[r.bufOff : r.bufOff+r.n]
	done := int64(0)
	for done < r.need {
		if p.ctx.Err() != nil {
			return p.ctx.Err()
		}
		n, err := f.ReadAt(buf[done:], r.off+done)
		done += int64(n)
		p.bytes.Add(int64(n))
		if done >= r.need {
			return nil
		}
		if err == nil && n > 0 && done%int64(p.s.lay.Align) == 0 {
			continue // a short read on an aligned boundary: go on
		}
		path := p.s.lay.Files[r.file]
		if err == nil || errors.Is(err, io.EOF) {
			size := int64(-1)
			if st, serr := f.Stat(); serr == nil {
				size = st.Size()
			}
			return &ReadError{Layer: r.layer, File: path, Offset: r.off,
				Err: fmt.Errorf("%w: the file is %d bytes, layer %d needs bytes up to %d", ErrTruncated, size, r.layer, r.off+r.need)}
		}
		return &ReadError{Layer: r.layer, File: path, Offset: r.off + done, Err: err}
	}
	return nil
}

// Next returns the next layer once its bytes have landed. After an error
// the pass is over; Close it.
func (p *Pass) Next(ctx context.Context) (*Slot, error) {
	if p.next >= len(p.s.lay.Layers) {
		return nil, io.EOF
	}
	sl := p.slots[p.next%len(p.slots)]
	t0 := time.Now()
	select {
	case <-sl.ready:
	default:
		select {
		case <-sl.ready:
		case <-p.ctx.Done():
			if err := p.firstErr(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("layer %d: %w", p.next, p.ctx.Err())
		case <-ctx.Done():
			return nil, fmt.Errorf("layer %d: %w", p.next, ctx.Err())
		}
	}
	p.wait += time.Since(t0)
	p.next++
	return sl, nil
}

// Stats reports the pass's I/O so far.
func (p *Pass) Stats() PassStats {
	p.busyMu.Lock()
	busy := p.busy
	if p.inFlight > 0 {
		busy += time.Since(p.busyFrom)
	}
	p.busyMu.Unlock()
	return PassStats{Bytes: p.bytes.Load(), ReadWall: time.Duration(p.lastRead.Load()), Wait: p.wait, ReadBusy: busy}
}

// Close stops the pass, waits for in-flight reads, closes its files and
// returns the ring to the streamer. It returns the pass's read error, if
// any. Slots still held are reclaimed.
func (p *Pass) Close() error {
	if p.closed {
		return p.firstErr()
	}
	p.closed = true
	p.cancel()
	p.wg.Wait()
	for i, f := range p.files {
		if f != nil {
			f.Close()
			p.files[i] = nil
		}
	}
	for _, sl := range p.slots {
		sl.pass = nil
		sl.pending.Store(0)
		select {
		case <-sl.ready:
		default:
		}
	}
	p.s.busy.Store(false)
	return p.firstErr()
}
