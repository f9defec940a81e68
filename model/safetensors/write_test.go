package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func TestWriteFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	big := randomBytes(3<<20+5, 1) // streamed in odd-sized chunks by Fill
	tensors := []WriteTensor{
		{Name: "z.first.in.data", DType: F32, Shape: []int64{3, 5}, Data: randomBytes(60, 2)},
		{Name: "odd.f16", DType: F16, Shape: []int64{7}, Data: randomBytes(14, 3)},
		{Name: "scalar", DType: F64, Shape: nil, Data: randomBytes(8, 4)},
		{Name: "empty", DType: BF16, Shape: []int64{0, 4}},
		{Name: `quote"back\slash<&>ünï`, DType: I32, Shape: []int64{1}, Data: randomBytes(4, 5)},
		{Name: "streamed.u8", DType: U8, Shape: []int64{int64(len(big))}, Fill: func(w io.Writer) error {
			for rest := big; len(rest) > 0; {
				n := min(len(rest), 100003)
				if _, err := w.Write(rest[:n]); err != nil {
					return err
				}
				rest = rest[n:]
			}
			return nil
		}},
		{Name: "fp8", DType: F8E4M3, Shape: []int64{2, 32}, Data: randomBytes(64, 6)},
		{Name: "flag", DType: BOOL, Shape: []int64{3}, Data: []byte{1, 0, 1}},
	}
	meta := map[string]string{"format": "pt", "writer": "tandem"}
	path := filepath.Join(dir, "model-00001-of-00001.safetensors")
	if err := WriteFile(path, tensors, meta); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	n := binary.LittleEndian.Uint64(raw)
	if (8+n)%8 != 0 {
		t.Errorf("data starts at %d, not a multiple of 8", 8+n)
	}
	// Any JSON reader can read the header.
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &doc); err != nil || len(doc) != len(tensors)+1 {
		t.Errorf("header is not plain JSON with %d entries: %v", len(tensors)+1, err)
	}

	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, _ := c.Header(path)
	if h.Metadata["writer"] != "tandem" || len(h.Metadata) != 2 {
		t.Errorf("metadata %v", h.Metadata)
	}
	prevEnd := h.DataStart
	for i, wt := range tensors {
		ti, ok := c.Tensor(wt.Name)
		if !ok {
			t.Fatalf("%q not found", wt.Name)
		}
		want := wt.Data
		if wt.Fill != nil {
			want = big
		}
		got, err := c.Bytes(wt.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) || ti.DType != wt.DType || !equalShape(ti.Shape, append([]int64{}, wt.Shape...)) {
			t.Errorf("tensor %d %q: %s %v, %d bytes; wrote %s %v, %d bytes", i, wt.Name, ti.DType, ti.Shape, len(got), wt.DType, wt.Shape, len(want))
		}
		if ti.Offset != prevEnd {
			t.Errorf("tensor %q at %d, want %d: data not packed in the given order", wt.Name, ti.Offset, prevEnd)
		}
		prevEnd = ti.Offset + ti.Size
	}
	if prevEnd != int64(len(raw)) {
		t.Errorf("data ends at %d, file is %d bytes", prevEnd, len(raw))
	}
}

func TestWriteFileErrors(t *testing.T) {
	cases := []struct {
		name    string
		tensors []WriteTensor
		kind    error
		tensor  string
	}{
		{"Data too short", []WriteTensor{{Name: "a", DType: F32, Shape: []int64{4}, Data: make([]byte, 15)}}, ErrShape, "a"},
		{"Data too long", []WriteTensor{{Name: "a", DType: BF16, Shape: []int64{2, 2}, Data: make([]byte, 9)}}, ErrShape, "a"},
		{"neither Data nor Fill", []WriteTensor{{Name: "a", DType: U8, Shape: []int64{1}}}, ErrShape, "a"},
		{"unknown dtype", []WriteTensor{{Name: "a", DType: "F4", Shape: []int64{2}, Data: []byte{0}}}, ErrDType, "a"},
		{"negative dimension", []WriteTensor{{Name: "a", DType: U8, Shape: []int64{-2}, Data: nil}}, ErrShape, "a"},
		{"duplicate name", []WriteTensor{{Name: "a", DType: U8, Shape: []int64{1}, Data: []byte{1}}, {Name: "a", DType: U8, Shape: []int64{1}, Data: []byte{2}}}, ErrDuplicate, "a"},
		{"reserved name", []WriteTensor{{Name: "__metadata__", DType: U8, Shape: []int64{1}, Data: []byte{1}}}, ErrSyntax, "__metadata__"},
		{"Fill short", []WriteTensor{{Name: "f", DType: U8, Shape: []int64{10}, Fill: func(w io.Writer) error { _, err := w.Write(make([]byte, 9)); return err }}}, ErrShape, "f"},
		{"Fill long", []WriteTensor{{Name: "f", DType: U8, Shape: []int64{10}, Fill: func(w io.Writer) error {
			w.Write(make([]byte, 6))
			_, err := w.Write(make([]byte, 6))
			return err
		}}}, ErrShape, "f"},
		{"Fill fails", []WriteTensor{{Name: "f", DType: U8, Shape: []int64{10}, Fill: func(io.Writer) error { return errors.New("generator broke") }}}, nil, "f"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "x.safetensors")
			err := WriteFile(path, c.tensors, nil)
			var e *Error
			if err == nil || c.kind != nil && !errors.Is(err, c.kind) || !errors.As(err, &e) || e.Tensor != c.tensor || e.File != path {
				t.Errorf("got %v; want %v naming %s and tensor %q", err, c.kind, path, c.tensor)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a failed write left %v", entries)
			}
		})
	}
	// A failed write leaves an existing file alone.
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	if err := WriteFile(path, []WriteTensor{{Name: "keep", DType: U8, Shape: []int64{1}, Data: []byte{7}}}, nil); err != nil {
		t.Fatal(err)
	}
	WriteFile(path, []WriteTensor{{Name: "f", DType: U8, Shape: []int64{1}, Fill: func(io.Writer) error { return io.ErrClosedPipe }}}, nil)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b, err := c.Bytes("keep"); err != nil || !bytes.Equal(b, []byte{7}) {
		t.Errorf("previous file damaged: %v %v", b, err)
	}
	if err := WriteFile(filepath.Join(dir, "no", "such", "dir.safetensors"), nil, nil); err == nil || !strings.Contains(err.Error(), "no") {
		t.Errorf("write into a missing directory: %v", err)
	}
}
