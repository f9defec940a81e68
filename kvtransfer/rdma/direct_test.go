package rdma

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testctx"
)

func TestWholeContinuation(t *testing.T) {
	const capacity = 1000
	for _, tc := range []struct {
		name           string
		n, frag, nfrag uint32
		due            int
		want           bool
	}{
		{"a full slot, more due", capacity, capacity, 0, 5000, true},
		{"the last bytes, ending the slot", 300, 300, 0, 300, true},
		{"a full slot ending the frame", capacity, capacity, 0, capacity, true},
		{"the last bytes, then a frame", 340, 300, 1, 300, false},
		{"continuation bytes that are not the slot's", capacity, capacity - 1, 0, 5000, false},
		{"a frame starts in a full continuation", capacity, capacity, 1, 5000, false},
		{"a short slot with more due", 300, 300, 0, 5000, false},
		{"more than is due", 400, 400, 0, 300, false},
		{"an empty slot", 0, 0, 0, 300, false},
		{"nothing due", 300, 300, 0, 0, false},
	} {
		h := slotHeader{n: tc.n, frag: tc.frag, nfrag: tc.nfrag}
		if got := wholeContinuation(h, tc.due, capacity); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// prefix is a frame's 8-byte prefix: header and payload lengths.
func prefix(hl, pl int) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(hl))
	return binary.LittleEndian.AppendUint32(b, uint32(pl))
}

// until waits for cond, which reads state under the link's mutex.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := testctx.Context(t)
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
		runtime.Gosched()
	}
}

// awaiting reports whether s's reader waits for the rest of a frame.
func awaiting(s *Conn) bool {
	l := s.stream.l
	l.mu.Lock()
	defer l.unlock()
	return s.stream.cont.on
}

func directs(s *Conn) int64 {
	l := s.stream.l
	l.mu.Lock()
	defer l.unlock()
	return l.stats.Direct
}

// TestDirectPlacement: while a reader waits for the rest of a frame, the
// poller copies each slot that is wholly a continuation of it straight
// into the reader's destination and releases it; a slot that also starts
// a frame, or whose framing is wrong, goes to the reader, which reads or
// refuses it. The slots are sent one by one, each once the reader is
// known to wait, so which path each takes is certain.
func TestDirectPlacement(t *testing.T) {
	const slot = 16 << 10
	const capacity = slot - hdrSize
	first := capacity - 8 - 3 // payload bytes in the frame's first slot
	for _, tc := range []struct {
		name   string
		tail   int  // payload bytes in the frame's last slot
		packed bool // a frame starts after them in that slot
		skip   bool // the reader skips the payload
		bad    bool // the first continuation says one byte less than it holds
		direct int64
	}{
		{"packed last slot", 100, true, false, false, 1},
		{"whole last slot", 100, false, false, false, 2},
		{"full last slot", capacity, false, false, false, 2},
		{"skipped payload", 100, false, true, false, 2},
		{"wrong continuation", 100, false, false, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := internalPair(t, Config{SlotSize: slot, Slots: 8, Reserve: 2})
			payload := randPayload(first+capacity+tc.tail, 7)
			type result struct {
				p   []byte
				err error
			}
			res := make(chan result, 1)
			go func() {
				var dst []byte
				err := s.ReadFrame(func(hdr []byte, n int) ([]byte, error) {
					if string(hdr) != "big" || n != len(payload) {
						return nil, errors.New("wrong frame")
					}
					if !tc.skip {
						dst = make([]byte, n)
					}
					return dst, nil
				})
				res <- result{dst, err}
			}()
			sendSlot(t, c, append(append(prefix(3, len(payload)), "big"...), payload[:first]...), 0, 1)
			until(t, "the reader to wait for the frame's second slot", func() bool { return awaiting(s) })
			frag := uint32(capacity)
			if tc.bad {
				frag--
			}
			sendSlot(t, c, payload[first:first+capacity], frag, 0)
			if !tc.bad {
				until(t, "the second slot placed", func() bool { return directs(s) == 1 && awaiting(s) })
				last := payload[first+capacity:]
				if tc.packed {
					sendSlot(t, c, append(append([]byte(nil), last...), framed("next", []byte("tail"))...), uint32(len(last)), 1)
				} else {
					sendSlot(t, c, last, uint32(len(last)), 0)
				}
			}
			r := <-res
			if tc.bad {
				if !errors.Is(r.err, errFrame) {
					t.Fatalf("a slot continuing %d bytes of the %d it holds: %v, want a framing error", frag, capacity, r.err)
				}
			} else if r.err != nil || (!tc.skip && !bytes.Equal(r.p, payload)) || (tc.skip && r.p != nil) {
				t.Fatalf("frame of %d bytes: %v, intact %v", len(payload), r.err, bytes.Equal(r.p, payload))
			}
			if got := directs(s); got != tc.direct {
				t.Errorf("%d slots placed by the poller, want %d", got, tc.direct)
			}
			if tc.bad {
				return
			}
			if !tc.packed {
				sendSlot(t, c, framed("next", []byte("tail")), 0, 1)
			}
			var p []byte
			err := s.ReadFrame(func(hdr []byte, n int) ([]byte, error) {
				if string(hdr) != "next" {
					return nil, errors.New("wrong frame")
				}
				p = make([]byte, n)
				return p, nil
			})
			if err != nil || string(p) != "tail" {
				t.Fatalf("the frame after: %q, %v", p, err)
			}
		})
	}
}

// TestFrameAbandonedMidway: a read deadline that passes in the middle of
// a frame, after the poller placed part of it, ends the read with a
// timeout, and later reads fail: the rest of the frame, still to come,
// would otherwise be read as frames.
func TestFrameAbandonedMidway(t *testing.T) {
	const slot = 16 << 10
	const capacity = slot - hdrSize
	c, s := internalPair(t, Config{SlotSize: slot, Slots: 8, Reserve: 2})
	first := capacity - 8 - 3
	payload := randPayload(first+3*capacity, 9)
	errc := make(chan error, 1)
	go func() {
		errc <- s.ReadFrame(func(hdr []byte, n int) ([]byte, error) { return make([]byte, n), nil })
	}()
	sendSlot(t, c, append(append(prefix(3, len(payload)), "big"...), payload[:first]...), 0, 1)
	until(t, "the reader to wait for the frame's second slot", func() bool { return awaiting(s) })
	sendSlot(t, c, payload[first:first+capacity], capacity, 0)
	until(t, "the second slot placed", func() bool { return directs(s) == 1 && awaiting(s) })
	s.SetReadDeadline(time.Now())
	err := <-errc
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past its deadline midway: %v, want a timeout", err)
	}
	s.SetReadDeadline(time.Time{})
	sendSlot(t, c, payload[first+capacity:first+2*capacity], capacity, 0)
	err = s.ReadFrame(func(hdr []byte, n int) ([]byte, error) { return make([]byte, n), nil })
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read after a frame was abandoned midway: %v, want the stream failed by the timeout", err)
	}
	if awaiting(s) {
		t.Fatal("the abandoned read still waits for its frame")
	}
}

func randPayload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
	return b
}
