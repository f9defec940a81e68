package msgpackscan

import (
	"encoding/binary"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func TestAcceptsValid(t *testing.T) {
	for _, v := range []any{
		map[string]any{"f": 1.5, "f32": float32(2), "neg": -100000, "big": uint64(1) << 63, "nil": nil, "t": true,
			"s": string(make([]byte, 70000)), "b": make([]byte, 300), "arr": make([]int, 70000), "m": map[string]int{"a": 1},
			"i8": int8(-3), "i16": int16(-300), "u16": uint16(60000), "u32": uint32(1 << 31)},
		[]any{[]any{[]any{"deep"}}},
		"plain",
		msgpack.RawMessage{0xd6, 0xff, 0, 0, 0, 1}, // fixext 4 (a timestamp)
	} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := Check(b); err != nil {
			t.Errorf("%T: %v", v, err)
		}
	}
}

// TestRefusesHugeDeclarations: a few bytes declaring 4-billion-element
// arrays, maps or strings are refused without decoding.
func TestRefusesHugeDeclarations(t *testing.T) {
	arr := binary.BigEndian.AppendUint32([]byte{0x81, 0xa1, 't', 0xdd}, 0xffffffff)
	str := binary.BigEndian.AppendUint32([]byte{0x81, 0xa1, 'n', 0xc6}, 0xffffffff)
	mp := []byte{0x81, 0xa1, 't', 0x91, 0x91, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff}
	deep := make([]byte, 0, 100)
	for i := 0; i < 60; i++ {
		deep = append(deep, 0x91)
	}
	deep = append(deep, 0xc0)
	for name, b := range map[string][]byte{
		"array": arr, "bin": str, "nested map": mp, "too deep": deep, "bad code": {0xc1},
		"truncated length": {0xcd, 1}, "truncated value": {0x92, 1}, "trailing": {0x01, 0x02}, "empty": {},
	} {
		if err := Check(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzCheck(f *testing.F) {
	b, _ := msgpack.Marshal(map[string]any{"shape": []int{1, 2}, "bits": []byte{1}, "s": "x"})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<12 || Check(b) != nil {
			return
		}
		// Whatever passes decodes without allocating beyond its size.
		var v any
		_ = msgpack.Unmarshal(b, &v)
	})
}
