package kvtransfer

import (
	"testing"
	"time"

	"github.com/tandem-inference/tandem/kvtransfer/kvtest"
	"github.com/tandem-inference/tandem/model"
)

// FuzzDataHeader feeds arbitrary header bytes and payload lengths to the
// receiver's header check: it must never panic, and whatever it accepts must
// land inside the expected part, on the chunk grid, with the announced length.
func FuzzDataHeader(f *testing.F) {
	seed := func(h *header) []byte {
		b, _ := encodeHeader(h)
		return b
	}
	f.Add(seed(&header{Type: frameData, Seq: 1, Layer: 3, Part: model.PartLatent, DType: model.BF16, Shape: []int{10, 40}, Len: 64}), 64)
	f.Add(seed(&header{Type: frameData, Seq: 1, Layer: 4, Part: model.PartKDAState, DType: model.F32, Shape: []int{2, 32, 32}, Off: 8128, Len: 64}), 64)
	f.Add(seed(&header{Type: frameData, Layer: -1, Off: -1, Len: -1}), 1)
	f.Add([]byte{0x81, 0xa1, 't', 0x04}, 0)
	cfg, err := kvtest.Config("tiny")
	if err != nil {
		f.Fatal(err)
	}
	srv := &Server{linger: time.Minute}
	f.Fuzz(func(t *testing.T, hb []byte, n int) {
		s := newRSession(srv, ExpectSpec{Session: "fuzz", Secret: testSecret, Model: cfg, Layers: []int{3, 4}, Tokens: 10,
			LatentDType: model.BF16, LatentCapacity: 10, ChunkSize: 64, Deadline: time.Now().Add(time.Minute)})
		s.mu.Lock()
		s.allocate()
		s.state = rReceiving
		s.mu.Unlock()
		var h header
		if decodeHeader(hb, &h) != nil {
			return
		}
		dst, cl, pl, err := s.place(&h, n)
		if err != nil || pl != placeClaimed {
			return
		}
		part := cl.rl.ls.Part(h.Part)
		if len(dst) != n || h.Len != int64(n) || h.Off%64 != 0 || h.Off < 0 || int(h.Off)+n > len(part.Data) || h.DType != part.DType {
			t.Fatalf("accepted %+v with payload %d: dst %d bytes in a %d-byte part", h, n, len(dst), len(part.Data))
		}
	})
}
