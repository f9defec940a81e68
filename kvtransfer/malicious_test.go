package kvtransfer

import (
	"context"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

// maliciousRig expects session sid for tiny's layers 3 (MLA) and 4 (KDA)
// with T tokens and a 64-byte chunk grid, and logs a raw client in.
func maliciousRig(t *testing.T, sid string, T int) (*rig, *Incoming, *rawClient) {
	r := newRig(t, "tiny", 1, ServerConfig{ChunkSize: 64})
	in, err := r.servers[0].Expect(ExpectSpec{Session: sid, Secret: testSecret, Model: r.cfg, Layers: []int{3, 4},
		Tokens: T, Deadline: time.Now().Add(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	rc := dialRaw(t, r.client, r.servers[0].Addr())
	rc.login(sid)
	return r, in, rc
}

func dataHeader(seq uint64, L int, kind model.PartKind, dt model.DType, shape []int, off, n int, payload []byte) *header {
	return &header{Type: frameData, Seq: seq, Layer: L, Part: kind, DType: dt, Shape: shape, Off: int64(off), Len: int64(n),
		CRC: crc32.Checksum(payload, castagnoli)}
}

// TestMaliciousHeaders: an authenticated peer sending a header that does not
// match the expected parts fails the session with a protocol error naming
// the problem, and the sender is told.
func TestMaliciousHeaders(t *testing.T) {
	const T = 10 // layer 3's latent is [10, 40] bf16 = 800 bytes
	lat := []int{T, 40}
	for _, tc := range []struct {
		name  string
		h     func(p []byte) *header
		n     int
		wants string
	}{
		{"unowned layer", func(p []byte) *header {
			return dataHeader(1, 0, model.PartKDAState, model.F32, []int{2, 32, 32}, 0, 64, p)
		}, 64, "not owned"},
		{"layer out of range", func(p []byte) *header { return dataHeader(1, 1<<40, model.PartLatent, model.BF16, lat, 0, 64, p) }, 64, "not owned"},
		{"unknown part", func(p []byte) *header { return dataHeader(1, 3, model.PartKDAState, model.F32, lat, 0, 64, p) }, 64, "has no part"},
		{"wrong dtype", func(p []byte) *header { return dataHeader(1, 3, model.PartLatent, model.F32, lat, 0, 64, p) }, 64, "expected BF16"},
		{"wrong shape", func(p []byte) *header {
			return dataHeader(1, 3, model.PartLatent, model.BF16, []int{T + 1, 40}, 0, 64, p)
		}, 64, "expected BF16 [10 40]"},
		{"offset outside", func(p []byte) *header { return dataHeader(1, 3, model.PartLatent, model.BF16, lat, 832, 64, p) }, 64, "outside"},
		{"negative offset", func(p []byte) *header { return dataHeader(1, 3, model.PartLatent, model.BF16, lat, -64, 64, p) }, 64, "outside"},
		{"off the grid", func(p []byte) *header { return dataHeader(1, 3, model.PartLatent, model.BF16, lat, 1, 64, p) }, 64, "chunk grid"},
		{"short length", func(p []byte) *header { return dataHeader(1, 3, model.PartLatent, model.BF16, lat, 0, 63, p) }, 63, "expected 64"},
		{"huge length", func(p []byte) *header { return dataHeader(1, 3, model.PartLatent, model.BF16, lat, 0, 1<<40, p) }, 64, "expected 64"},
		{"last chunk too long", func(p []byte) *header { return dataHeader(1, 3, model.PartLatent, model.BF16, lat, 768, 64, p) }, 64, "expected 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, in, rc := maliciousRig(t, "evil", T)
			p := make([]byte, tc.n)
			rc.write(tc.h(p), p)
			_, err := rc.read()
			if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tc.wants) {
				t.Fatalf("sender told %v; want a protocol error containing %q", err, tc.wants)
			}
			_, err = in.Wait(context.Background())
			var e *Error
			if !errors.As(err, &e) || !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tc.wants) || e.Peer == "" {
				t.Fatalf("receiver: %v", err)
			}
			r.checkFreed()
		})
	}
}

// TestHugeFramePrefixRefused: a frame announcing a payload over the limit is
// refused before a byte of it is read; the connection is dropped.
func TestHugeFramePrefixRefused(t *testing.T) {
	onTCP(t) // writes a raw TCP prefix
	r, in, rc := maliciousRig(t, "huge", 10)
	defer in.Cancel()
	hb, _ := encodeHeader(&header{Type: frameData, Seq: 1, Layer: 3})
	pre := appendFrameHead(nil, hb, 1<<31)
	raw := rc.c.(*tcpConn).c
	if _, err := raw.Write(pre); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.read(); err == nil {
		t.Fatal("connection still open after a 2 GiB frame announcement")
	}
	if st := r.servers[0].Stats(); st.ConnErrors != 1 {
		t.Errorf("stats %+v", st)
	}
	if got, _ := in.Progress(); got != 0 {
		t.Errorf("%d bytes accepted", got)
	}
}

// TestCorruptChunkNeverCommitted: a chunk failing its checksum is answered
// as bad and stays missing; the resend is verified; a verified chunk is never
// overwritten, even by a well-formed duplicate with other bytes.
func TestCorruptChunkNeverCommitted(t *testing.T) {
	const T = 10
	r, in, rc := maliciousRig(t, "corrupt", T)
	src := kvtest.RandomSeq(r.cfg, []int{3, 4}, T, model.BF16, 42)
	lat := src.Layers[3].Parts[0]
	good := lat.Data[:64]

	bad := dataHeader(1, 3, model.PartLatent, model.BF16, lat.Shape, 0, 64, good)
	bad.CRC ^= 1
	rc.write(bad, good)
	if a, err := rc.read(); err != nil || a.Type != frameAck || a.Seq != 1 || len(a.Bad) != 1 || a.Bad[0] != 1 {
		t.Fatalf("corrupt chunk answered with %+v, %v", a, err)
	}
	if got, _ := in.Progress(); got != 0 {
		t.Fatalf("a corrupt chunk counted as %d verified bytes", got)
	}
	seq := uint64(2)
	send := func(L int, p *model.Part, off int, data []byte) {
		t.Helper()
		h := dataHeader(seq, L, p.Kind, p.DType, p.Shape, off, len(data), data)
		rc.write(h, data)
		a, err := rc.read()
		if err != nil || a.Type != frameAck || a.Seq != seq || len(a.Bad)+len(a.Busy) != 0 {
			t.Fatalf("chunk seq %d answered with %+v, %v", seq, a, err)
		}
		seq++
	}
	send(3, &lat, 0, good)
	other := make([]byte, 64) // a well-formed duplicate with different bytes
	send(3, &lat, 0, other)
	for _, L := range []int{3, 4} {
		for i := range src.Layers[L].Parts {
			p := &src.Layers[L].Parts[i]
			for off := 0; off < len(p.Data); off += 64 {
				if L == 3 && off == 0 {
					continue
				}
				send(L, p, off, p.Data[off:min(off+64, len(p.Data))])
			}
		}
	}
	rc.write(&header{Type: frameEnd, Tokens: T, Layers: 2, Parts: 5, Bytes: int64(src.Bytes()), Sent: []int{3, 4}}, nil)
	if c, err := rc.read(); err != nil || c.Type != frameCommit {
		t.Fatalf("after END: %+v %v", c, err)
	}
	st, err := in.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := kvtest.Diff(src, st, []int{3, 4}); err != nil {
		t.Fatal(err)
	}
	if cap(st.Layers[3].Parts[0].Data) < len(lat.Data) {
		t.Error("latent buffer smaller than its data")
	}
	if got := r.servers[0].Stats().ChecksumFailures; got != 1 {
		t.Errorf("%d checksum failures, want 1", got)
	}
}

// TestClaimedChunkBusy: a chunk half-received on one connection is answered
// busy on another; once the first connection dies the claim is released and
// the chunk is accepted.
func TestClaimedChunkBusy(t *testing.T) {
	onTCP(t) // stalls a raw TCP writer
	const T = 10
	r, in, a := maliciousRig(t, "busy", T)
	defer in.Cancel()
	src := kvtest.RandomSeq(r.cfg, []int{3}, T, model.BF16, 1)
	lat := &src.Layers[3].Parts[0]
	chunk := lat.Data[:64]
	h := dataHeader(1, 3, lat.Kind, lat.DType, lat.Shape, 0, 64, chunk)

	// Connection a writes the frame but only half of its payload.
	hb, _ := encodeHeader(h)
	frame := append(appendFrameHead(nil, hb, 64), chunk[:32]...)
	if _, err := a.c.(*tcpConn).c.Write(frame); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(testctx.Context(t), t, "the chunk claimed", func() bool { return chunkIs(r.servers[0], "busy", 3, lat.Kind, 0, chunkClaimed) })

	b := dialRaw(t, r.client, r.servers[0].Addr())
	b.login("busy")
	b.write(h, chunk)
	if ack, err := b.read(); err != nil || len(ack.Busy) != 1 {
		t.Fatalf("chunk claimed elsewhere answered with %+v %v", ack, err)
	}
	a.c.Close()
	// The claim is released once the server reads the dead connection's
	// error; then the resend is accepted.
	testkit.WaitFor(testctx.Context(t), t, "the claim released", func() bool { return chunkIs(r.servers[0], "busy", 3, lat.Kind, 0, chunkMissing) })
	h.Seq = 2
	b.write(h, chunk)
	if ack, err := b.read(); err != nil || len(ack.Busy) != 0 {
		t.Fatalf("chunk released by its dead connection answered with %+v %v", ack, err)
	}
	if got, _ := in.Progress(); got != 64 {
		t.Errorf("%d bytes verified, want 64", got)
	}
}

// chunkIs reports whether chunk idx of part kind of layer L in session sid
// on srv is in state want (the receiver's own bookkeeping).
func chunkIs(srv *Server, sid string, L int, kind model.PartKind, idx int, want chunkState) bool {
	srv.mu.Lock()
	s := srv.sessions[sid]
	srv.mu.Unlock()
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rl := s.byLayer[L]
	if rl == nil {
		return false
	}
	for _, rp := range rl.parts {
		if rp.want.Kind == kind && idx < len(rp.chunks) {
			return rp.chunks[idx] == want
		}
	}
	return false
}
