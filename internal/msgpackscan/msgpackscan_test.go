package msgpackscan

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"reflect"
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
		// Whatever passes decodes without allocating beyond its size,
		// and the typed walk reads it without a panic.
		var v any
		_ = msgpack.Unmarshal(b, &v)
		_ = CheckFor(b, rangedType)
	})
}

type inner struct {
	ID   int32  `msgpack:"id" json:"id"`
	Seed uint64 `msgpack:"seed" json:"seed"`
}

type embedded struct {
	Small uint8 `msgpack:"small" json:"small"`
}

type ranged struct {
	embedded
	IDs   []int32          `msgpack:"ids" json:"ids"`
	N     int              `msgpack:"n" json:"n"`
	In    *inner           `msgpack:"in" json:"in"`
	Rows  []inner          `msgpack:"rows" json:"rows"`
	ByKey map[string]int16 `msgpack:"by_key" json:"by_key"`
	Raw   []byte           `msgpack:"raw" json:"raw"`
	Other any              `msgpack:"other" json:"other"`
}

var rangedType = reflect.TypeFor[ranged]()

// TestCheckForRefusesWhatJSONRefuses: an integer that the msgpack decoder
// would wrap into its field (2^32+5 into an int32 as 5) is refused with the
// field's path, exactly where encoding/json refuses the same number.
func TestCheckForRefusesWhatJSONRefuses(t *testing.T) {
	for _, c := range []struct {
		v    map[string]any
		path string
	}{
		{map[string]any{"ids": []int64{1, 1<<32 + 5}}, "ids[1]"},
		{map[string]any{"ids": []int64{-(1 << 32) + 5}}, "ids[0]"},
		{map[string]any{"ids": []uint64{1<<63 + 5}}, "ids[0]"},
		{map[string]any{"ids": []int64{math.MaxInt32 + 1}}, "ids[0]"},
		{map[string]any{"ids": []int64{math.MinInt32 - 1}}, "ids[0]"},
		{map[string]any{"n": uint64(1<<63 + 5)}, "n"},
		{map[string]any{"small": 256}, "small"},
		{map[string]any{"small": -1}, "small"},
		{map[string]any{"in": map[string]any{"seed": -1}}, "in.seed"},
		{map[string]any{"in": map[string]any{"id": int64(1) << 40}}, "in.id"},
		{map[string]any{"rows": []any{map[string]any{"id": 1}, map[string]any{"id": int64(1) << 31}}}, "rows[1].id"},
		{map[string]any{"by_key": map[string]any{"a": 40000}}, `by_key["a"]`},
	} {
		b, err := msgpack.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		err = CheckFor(b, rangedType)
		var re *RangeError
		if !errors.As(err, &re) || re.Path != c.path {
			t.Errorf("%v: got %v, want a range error at %s", c.v, err, c.path)
			continue
		}
		// encoding/json refuses the same value.
		j, _ := json.Marshal(c.v)
		if err := json.Unmarshal(j, new(ranged)); err == nil {
			t.Errorf("%s: json accepts what msgpack refuses", j)
		}
	}
}

// TestCheckForAcceptsEveryInRangeValue: the limits themselves pass, and so
// do values the walker does not own (unknown keys, bytes, any, nil).
func TestCheckForAcceptsEveryInRangeValue(t *testing.T) {
	v := map[string]any{
		"ids": []int64{math.MaxInt32, math.MinInt32, 0, -1}, "n": int64(math.MinInt64), "small": uint64(255),
		"in": map[string]any{"id": -5, "seed": uint64(math.MaxUint64)}, "rows": []any{map[string]any{"id": 7}},
		"by_key": map[string]any{"a": -32768}, "raw": []byte{1, 2}, "other": []any{uint64(1<<63 + 5)}, "unknown": int64(1) << 40,
	}
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckFor(b, rangedType); err != nil {
		t.Fatal(err)
	}
	var back ranged
	if err := msgpack.Unmarshal(b, &back); err != nil || back.IDs[1] != math.MinInt32 || back.In.Seed != math.MaxUint64 {
		t.Fatalf("decoded %+v, %v", back, err)
	}
	nilIn, _ := msgpack.Marshal(map[string]any{"in": nil})
	if err := CheckFor(nilIn, rangedType); err != nil {
		t.Fatal(err)
	}
}
