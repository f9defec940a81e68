package rdma

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"

	"github.com/tandem-inference/tandem/internal/crc32c"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/fakeverbs"
	"github.com/tandem-inference/tandem/kvtransfer/rdma/verbs"
)

// framed is one frame as a stream carries it: prefix, header, payload.
func framed(hdr string, payload []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(hdr)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	return append(append(b, hdr...), payload...)
}

// internalPair returns the two ends of a stream over a link on a fake
// wire, for tests that reach inside the link; everything is closed when
// the test ends.
func internalPair(t *testing.T, cfg Config) (c, s *Conn) {
	t.Helper()
	ctx := testctx.Context(t)
	fab := fakeverbs.NewFabric(fakeverbs.Faults{}, 1)
	gid := verbs.GIDFromIP(net.IPv4(127, 0, 0, 1))
	cd, cs := cfg, cfg
	cd.Provider, cs.Provider = fab.Host("a", gid), fab.Host("b", gid)
	d, err := New(cd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	srv, err := New(cs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err = d.Dial(ctx, ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c, s
}

// sendSlot sends p as the payload of one fresh data slot of c's stream,
// with the header's continuation bytes and frame starts as given (true
// or not) and valid checksums.
func sendSlot(t *testing.T, c *Conn, p []byte, frag, nfrag uint32) {
	t.Helper()
	l := c.stream.l
	seq, h, buf, err := l.reserve(c.wd, c.stream, false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf[hdrSize:], p)
	h.n, h.nfrag, h.frag, h.pcrc = uint32(len(p)), nfrag, frag, crc32c.Checksum(p)
	l.commit(seq, h, buf, c.stream)
}

// TestFramingCheckedInPackedSlots: a slot whose checksums hold but whose
// framing disagrees with its header (the frames it says start in it, or
// continuation bytes where a frame starts) is refused with errFrame, and
// the stream stays failed; the same slot with a true header reads whole.
func TestFramingCheckedInPackedSlots(t *testing.T) {
	for _, tc := range []struct {
		name        string
		nfrag, lead uint32
		ok          bool
	}{
		{"true header", 2, 0, true},
		{"more frames than it says", 1, 0, false},
		{"fewer frames than it says", 3, 0, false},
		{"continuation where a frame starts", 2, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := internalPair(t, Config{SlotSize: 16 << 10, Slots: 8, Reserve: 2})

			// One slot holding two frames, sealed with valid checksums.
			sendSlot(t, c, append(framed("one", []byte("first payload")), framed("two", []byte("second"))...), tc.lead, tc.nfrag)

			var got []string
			read := func() error {
				return s.ReadFrame(func(hdr []byte, n int) ([]byte, error) {
					got = append(got, string(hdr))
					return make([]byte, n), nil
				})
			}
			err := errors.Join(read(), read())
			if tc.ok {
				if err != nil || len(got) != 2 || got[0] != "one" || got[1] != "two" {
					t.Fatalf("read %q: %v", got, err)
				}
				return
			}
			if !errors.Is(err, errFrame) {
				t.Fatalf("read %q: %v, want a framing error", got, err)
			}
			if err := read(); !errors.Is(err, errFrame) {
				t.Fatalf("a read after the framing error: %v", err)
			}
		})
	}
}
