package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tandem-inference/tandem/internal/diskfree"
)

// TestSparsePast4GiB: a sparse file whose tensors sit past 2^31 and 2^32
// bytes (as the experts of every K3 layer shard do) keeps those offsets
// exact in its header, opens, coalesces into runs, reads its tensors as
// zeros, and takes no disk.
func TestSparsePast4GiB(t *testing.T) {
	dir := t.TempDir()
	if _, ok := diskfree.Allocated(dir); !ok {
		t.Skip("this platform does not report allocated blocks")
	}
	tensors := []WriteTensor{
		{Name: "a.big", DType: U8, Shape: []int64{3 << 29, 4}}, // 6 GiB: everything after it is past 2^32
		{Name: "b.past4g", DType: BF16, Shape: []int64{3, 5}},
		{Name: "c.gap", DType: U8, Shape: []int64{1 << 31}},
		{Name: "d.past8g", DType: F32, Shape: []int64{7}},
	}
	path := filepath.Join(dir, "model-00002-of-000096.safetensors")
	if err := WriteSparse(path, tensors, nil); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	used, _ := diskfree.Allocated(path)
	if used > 1<<20 {
		t.Fatalf("a %d-byte sparse file occupies %d bytes of disk: its data was written, not left as holes", fi.Size(), used)
	}

	// The header holds the offsets literally, as 64-bit integers.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n [8]byte
	if _, err := f.ReadAt(n[:], 0); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, binary.LittleEndian.Uint64(n[:]))
	if _, err := f.ReadAt(hdr, 8); err != nil {
		t.Fatal(err)
	}
	var doc map[string]struct {
		DataOffsets [2]uint64 `json:"data_offsets"`
	}
	if err := json.Unmarshal(hdr, &doc); err != nil {
		t.Fatal(err)
	}
	const a = 6 << 30
	want := map[string][2]uint64{"a.big": {0, a}, "b.past4g": {a, a + 30}, "c.gap": {a + 30, a + 30 + 1<<31}, "d.past8g": {a + 30 + 1<<31, a + 58 + 1<<31}}
	for name, w := range want {
		if doc[name].DataOffsets != w {
			t.Errorf("%s: data_offsets %v in the header, want %v", name, doc[name].DataOffsets, w)
		}
	}

	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, _ := c.Header(path)
	if fi.Size() != h.DataStart+a+58+1<<31 {
		t.Fatalf("file is %d bytes, want the header and %d bytes of data", fi.Size(), int64(a+58+1<<31))
	}
	d, _ := c.Tensor("d.past8g")
	if d.Offset != h.DataStart+a+30+1<<31 || d.Size != 28 || d.Offset <= 1<<33 {
		t.Fatalf("d.past8g at %d (%d bytes), want %d (28)", d.Offset, d.Size, h.DataStart+a+30+1<<31)
	}
	runs, err := c.Runs([]string{"d.past8g", "b.past4g"})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Offset != h.DataStart+a || runs[0].Length != 30 || runs[1].Offset != d.Offset || runs[1].Length != 28 {
		t.Fatalf("runs %+v", runs)
	}
	if runs, _ := c.Runs(c.Names()); len(runs) != 1 || runs[0].Offset != h.DataStart || runs[0].Length != a+58+1<<31 {
		t.Fatalf("all tensors in runs %+v, want one run of the whole data section", runs)
	}
	for _, name := range []string{"b.past4g", "d.past8g"} {
		info, _ := c.Tensor(name)
		got := bytes.Repeat([]byte{0xff}, int(info.Size))
		if err := c.ReadTensor(name, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, make([]byte, info.Size)) {
			t.Errorf("%s reads %x from a hole", name, got)
		}
		view, err := c.Bytes(name) // through the mapping, past 4 GiB
		if err != nil || !bytes.Equal(view, make([]byte, info.Size)) {
			t.Errorf("%s maps as %x, %v", name, view, err)
		}
	}
}

func TestWriteSparseRefusesData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.safetensors")
	err := WriteSparse(path, []WriteTensor{{Name: "w", DType: U8, Shape: []int64{1}, Data: []byte{1}}}, nil)
	var e *Error
	if !errors.Is(err, ErrShape) || !errors.As(err, &e) || e.Tensor != "w" {
		t.Fatalf("sparse write of a tensor with data: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused write left %s: %v", path, err)
	}
}
