package kvtransfer

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tandem-inference/tandem/internal/msgpackscan"
)

func TestScanMsgpackAcceptsValid(t *testing.T) {
	for _, v := range []any{
		&header{Type: frameData, Seq: 1 << 40, Layer: 92, Shape: []int{300000, 576}, Off: -5, CRC: 0xffffffff, Session: "s", Nonce: make([]byte, 300)},
		&header{Type: frameWelcome, Done: []partBits{{Layer: 1, Part: 2, Bits: []byte{1, 2, 3}}}, Meta: msgpack.RawMessage{0x81, 0xa1, 'x', 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}},
		map[string]any{"f": 1.5, "f32": float32(2), "neg": -100000, "big": uint64(1) << 63, "nil": nil, "t": true, "s": string(make([]byte, 70000)),
			"arr": make([]int, 70000), "m": map[string]int{"a": 1}},
	} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := msgpackscan.Check(b); err != nil {
			t.Errorf("%T: %v", v, err)
		}
	}
}

// TestScanMsgpackRefusesHugeDeclarations: a HELLO-sized header declaring a
// 4-billion-element Shape or a 4 GiB nonce is refused without decoding.
func TestScanMsgpackRefusesHugeDeclarations(t *testing.T) {
	arr := []byte{0x82, 0xa1, 't', 0x02, 0xa2, 's', 'h', 0xdd}
	arr = binary.BigEndian.AppendUint32(arr, 0xffffffff)
	str := []byte{0x82, 0xa1, 't', 0x02, 0xa1, 'n', 0xc6}
	str = binary.BigEndian.AppendUint32(str, 0xffffffff)
	deep := []byte{0x81, 0xa1, 't', 0x91, 0x91, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff}
	for name, b := range map[string][]byte{"array": arr, "bin": str, "nested map": deep, "bad type": {0xc1}, "truncated": {0xcd, 1}} {
		if err := msgpackscan.Check(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
		var h header
		if err := decodeHeader(b, &h); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func FuzzScanMsgpack(f *testing.F) {
	b, _ := msgpack.Marshal(&header{Type: frameData, Shape: []int{1, 2}, Done: []partBits{{Bits: []byte{1}}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<12 || msgpackscan.Check(b) != nil {
			return
		}
		// Whatever passes decodes without allocating more than its size
		// allows (the decoder may still refuse it).
		var h header
		msgpack.Unmarshal(b, &h)
	})
}

// TestHeaderIntegersDoNotWrap: a CRC, layer or frame type that does not fit
// its field is refused, not decoded modulo its width (a CRC of 2^32+5
// would otherwise check against 5).
func TestHeaderIntegersDoNotWrap(t *testing.T) {
	for _, v := range []map[string]any{
		{"t": int(frameData), "crc": int64(1<<32 + 5)},
		{"t": int(frameData) + 256},
		{"t": int(frameData), "s": -1},
		{"t": int(frameData), "l": uint64(1<<63 + 5)},
		{"t": int(frameWelcome), "done": []any{map[string]any{"l": 1, "pk": 256 + 1}}},
	} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var h header
		if err := decodeHeader(b, &h); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("%v: decoded as %+v (%v)", v, h, err)
		}
	}
}
