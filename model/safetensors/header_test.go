package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
)

// file builds a safetensors image: the header's length, the header, then
// dataLen bytes of data.
func file(header string, dataLen int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, dataLen)...)
}

// withLen builds an image whose length field says n whatever follows.
func withLen(n uint64, rest string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, n), rest...)
}

func parse(b []byte) (*Header, error) {
	return ParseHeader(bytes.NewReader(b), int64(len(b)), "shard.safetensors")
}

type hostileCase struct {
	name   string
	data   []byte
	kind   error
	tensor string // the tensor the error must name; "" for file-level errors
	says   string // a fragment the message must contain
}

func hostileCases() []hostileCase {
	return []hostileCase{
		{"empty file", nil, ErrHeaderSize, "", "too short"},
		{"7-byte file", []byte{1, 2, 3, 4, 5, 6, 7}, ErrHeaderSize, "", "too short"},
		{"header length past the file end", withLen(100, `{}`), ErrHeaderSize, "", "runs past the end"},
		{"header length just past the file end", withLen(3, `{}`), ErrHeaderSize, "", "runs past the end"},
		{"absurd header length", withLen(1<<62, `{}`), ErrHeaderSize, "", "exceeds the limit"},
		{"header length over the cap", withLen(MaxHeaderSize+1, `{}`), ErrHeaderSize, "", "exceeds the limit"},
		{"zero header length", withLen(0, ""), ErrSyntax, "", "not a JSON object"},
		{"truncated JSON", file(`{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]`, 4), ErrSyntax, "a", ""},
		{"not an object", file(`[1, 2]`, 0), ErrSyntax, "", "not a JSON object"},
		{"garbage", file("\x00\x01garbage", 0), ErrSyntax, "", ""},
		{"invalid UTF-8", file("{\"a\xff\": {}}", 0), ErrSyntax, "", "UTF-8"},
		{"trailing data", file(`{} {}`, 0), ErrSyntax, "", "trailing data"},
		{"entry not an object", file(`{"a": 5}`, 0), ErrSyntax, "a", ""},
		{"no dtype", file(`{"a": {"shape": [1], "data_offsets": [0, 4]}}`, 4), ErrSyntax, "a", "no dtype"},
		{"no shape", file(`{"a": {"dtype": "F32", "data_offsets": [0, 4]}}`, 4), ErrSyntax, "a", "no shape"},
		{"null shape", file(`{"a": {"dtype": "F32", "shape": null, "data_offsets": [0, 4]}}`, 4), ErrSyntax, "a", "no shape"},
		{"no offsets", file(`{"a": {"dtype": "F32", "shape": [1]}}`, 4), ErrSyntax, "a", "no data_offsets"},
		{"three offsets", file(`{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}`, 8), ErrSyntax, "a", "3 numbers"},
		{"fractional offset", file(`{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4.5]}}`, 8), ErrSyntax, "a", ""},
		{"string shape", file(`{"a": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}}`, 4), ErrSyntax, "a", ""},
		{"unknown dtype", file(`{"w": {"dtype": "F7", "shape": [1], "data_offsets": [0, 4]}}`, 4), ErrDType, "w", `"F7"`},
		{"lower-case dtype", file(`{"w": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}}`, 4), ErrDType, "w", ""},
		{"shape x dtype above the byte length", file(`{"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 16]}}`, 16), ErrShape, "w", "needs 32 bytes"},
		{"shape x dtype below the byte length", file(`{"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}`, 16), ErrShape, "w", "needs 12 bytes"},
		{"negative dimension", file(`{"w": {"dtype": "U8", "shape": [-1, 4], "data_offsets": [0, 4]}}`, 4), ErrShape, "w", "negative"},
		{"shape overflows", file(`{"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}`, 0), ErrShape, "w", "overflows"},
		{"overflow hidden by a zero dimension", file(`{"w": {"dtype": "U8", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}}`, 0), ErrShape, "w", "overflows"},
		{"offsets descending", file(`{"w": {"dtype": "U8", "shape": [4], "data_offsets": [8, 4]}}`, 8), ErrOffsets, "w", "ascending"},
		{"negative offset", file(`{"w": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}}`, 8), ErrOffsets, "w", ""},
		{"offsets past the file end", file(`{"w": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]}}`, 8), ErrOffsets, "w", "past the data section's 8 bytes"},
		{"offsets far past the file end", file(`{"w": {"dtype": "U8", "shape": [4], "data_offsets": [9223372036854775800, 9223372036854775804]}}`, 8), ErrOffsets, "w", ""},
		{"overlapping tensors", file(`{"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]}}`, 16), ErrOverlap, "b", `tensor "a"`},
		{"tensor inside another", file(`{"big": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]}, "small": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}`, 16), ErrOverlap, "small", `"big"`},
		{"same range twice", file(`{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}`, 8), ErrOverlap, "b", ""},
		{"duplicate tensor", file(`{"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}`, 8), ErrDuplicate, "w", "twice"},
		{"duplicate metadata", file(`{"__metadata__": {}, "__metadata__": {}}`, 0), ErrDuplicate, "__metadata__", ""},
		{"metadata not strings", file(`{"__metadata__": {"n": 5}}`, 0), ErrSyntax, "__metadata__", "strings to strings"},
	}
}

func TestParseHeaderHostile(t *testing.T) {
	for _, c := range hostileCases() {
		t.Run(c.name, func(t *testing.T) {
			h, err := parse(c.data)
			if err == nil {
				t.Fatalf("accepted: %+v", h)
			}
			if !errors.Is(err, c.kind) {
				t.Errorf("error %q is not %v", err, c.kind)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "shard.safetensors" || e.Tensor != c.tensor {
				t.Errorf("error %q: want an *Error naming shard.safetensors and tensor %q", err, c.tensor)
			}
			msg := err.Error()
			if !strings.Contains(msg, "shard.safetensors") || c.tensor != "" && !strings.Contains(msg, `"`+c.tensor+`"`) || !strings.Contains(msg, c.says) {
				t.Errorf("message %q lacks the file, the tensor %q or %q", msg, c.tensor, c.says)
			}
		})
	}
}

func TestParseHeaderValidEdges(t *testing.T) {
	cases := []struct {
		name  string
		data  []byte
		names []string // in offset order
	}{
		{"empty header", file(`{}`, 0), nil},
		{"padded with spaces", file(`{"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}     `, 4), []string{"a"}},
		{"metadata only", file(`{"__metadata__": {"format": "pt"}}`, 0), nil},
		{"empty tensors share an offset", file(`{"z": {"dtype": "F32", "shape": [0, 8], "data_offsets": [4, 4]}, "y": {"dtype": "U8", "shape": [0], "data_offsets": [4, 4]}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}`, 8), []string{"a", "y", "z"}},
		{"out of order in the JSON", file(`{"b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}, "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}`, 8), []string{"a", "b"}},
		{"a hole and trailing bytes", file(`{"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}, "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}`, 10), []string{"a", "b"}},
		{"unknown fields ignored", file(`{"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8], "quant": "x"}}`, 8), []string{"a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := parse(c.data)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ti := range h.Tensors {
				got = append(got, ti.Name)
			}
			if strings.Join(got, ",") != strings.Join(c.names, ",") {
				t.Errorf("tensors %v, want %v", got, c.names)
			}
			if want := int64(len(c.data)) - int64(len(c.data)-8-int(binary.LittleEndian.Uint64(c.data))); h.DataStart != want {
				t.Errorf("DataStart %d, want %d", h.DataStart, want)
			}
		})
	}
}

// The fixture shards, as an independent reader (Python's struct + json)
// lists them: name, dtype, shape and data_offsets.
var fixtureShards = map[string]struct {
	dataStart int64
	tensors   []TensorInfo // Offset relative to the data section
}{
	"model-00001-of-00002.safetensors": {1030, []TensorInfo{
		{Name: "plain.f32.2d", DType: F32, Shape: []int64{16, 16}, Offset: 0, Size: 1024},
		{Name: "plain.bf16.1d", DType: BF16, Shape: []int64{128}, Offset: 1024, Size: 256},
		{Name: "tricky.f16.1d", DType: F16, Shape: []int64{64}, Offset: 1280, Size: 128},
		{Name: "packed.u8.2d", DType: U8, Shape: []int64{7, 32}, Offset: 1408, Size: 224},
		{Name: "scalar.f32", DType: F32, Shape: []int64{}, Offset: 1632, Size: 4},
		{Name: "empty.f32", DType: F32, Shape: []int64{0, 8}, Offset: 1636, Size: 0},
		{Name: "language_model.model.layers.0.block_sparse_moe.experts.0.w1.weight_packed", DType: U8, Shape: []int64{2, 32}, Offset: 1636, Size: 64},
		{Name: "language_model.model.layers.0.block_sparse_moe.experts.1.w1.weight_packed", DType: U8, Shape: []int64{2, 32}, Offset: 1700, Size: 64},
		{Name: "rank3.f32", DType: F32, Shape: []int64{2, 3, 4}, Offset: 1764, Size: 96},
		{Name: "rank4.u8", DType: U8, Shape: []int64{2, 2, 2, 2}, Offset: 1860, Size: 16},
	}},
	"model-00002-of-00002.safetensors": {261, []TensorInfo{
		{Name: "second.shard.f32", DType: F32, Shape: []int64{10, 10}, Offset: 0, Size: 400},
		{Name: "second.shard.u8", DType: U8, Shape: []int64{300}, Offset: 400, Size: 300},
		{Name: `weird\name."with"quotes`, DType: F32, Shape: []int64{3}, Offset: 700, Size: 12},
	}},
}

const fixtureDir = "testdata/k3-ops/safetensors"

func TestParseHeaderFixture(t *testing.T) {
	for name, want := range fixtureShards {
		path := fixtureDir + "/" + name
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		h, err := ParseHeader(bytes.NewReader(b), int64(len(b)), path)
		if err != nil {
			t.Fatal(err)
		}
		if h.DataStart != want.dataStart {
			t.Errorf("%s: DataStart %d, want %d", name, h.DataStart, want.dataStart)
		}
		if len(h.Tensors) != len(want.tensors) {
			t.Fatalf("%s: %d tensors, want %d", name, len(h.Tensors), len(want.tensors))
		}
		for i, w := range want.tensors {
			g := h.Tensors[i]
			if g.Name != w.Name || g.DType != w.DType || !equalShape(g.Shape, w.Shape) ||
				g.Offset != want.dataStart+w.Offset || g.Size != w.Size || g.File != path {
				t.Errorf("%s tensor %d: %+v, want %+v at data offset %d", name, i, g, w, w.Offset)
			}
		}
	}
	b, _ := os.ReadFile(fixtureDir + "/model-00001-of-00002.safetensors")
	h, _ := parse(b)
	if h.Metadata["format"] != "pt" || !strings.Contains(h.Metadata["note"], "must be skipped") || len(h.Metadata) != 2 {
		t.Errorf("metadata %v", h.Metadata)
	}
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A reader that fails stands for an I/O error under the header.
type failingReader struct{}

func (failingReader) ReadAt([]byte, int64) (int, error) { return 0, errors.New("disk on fire") }

func TestParseHeaderReadError(t *testing.T) {
	_, err := ParseHeader(failingReader{}, 100, "x.safetensors")
	if err == nil || !strings.Contains(err.Error(), "disk on fire") || !strings.Contains(err.Error(), "x.safetensors") {
		t.Errorf("got %v", err)
	}
}
