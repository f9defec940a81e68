package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// copyFixture copies the two fixture shards into a fresh directory.
func copyFixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name := range fixtureShards {
		b, err := os.ReadFile(filepath.Join(fixtureDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func TestOpenFixtureByScan(t *testing.T) {
	for _, copied := range []bool{false, true} {
		t.Run("copyViews="+strconv.FormatBool(copied), func(t *testing.T) {
			c, err := Open(fixtureDir)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.copyViews = copied || !canMap

			var want []string
			for _, s := range fixtureShards {
				for _, ti := range s.tensors {
					want = append(want, ti.Name)
				}
			}
			slices.Sort(want)
			if got := c.Names(); !slices.Equal(got, want) {
				t.Errorf("Names() = %q, want %q", got, want)
			}
			wantFiles := []string{filepath.Join(fixtureDir, "model-00001-of-00002.safetensors"), filepath.Join(fixtureDir, "model-00002-of-00002.safetensors")}
			if got := c.Files(); !slices.Equal(got, wantFiles) {
				t.Errorf("Files() = %q", got)
			}
			if c.TotalSize() != 1876+712 {
				t.Errorf("TotalSize() = %d, want %d", c.TotalSize(), 1876+712)
			}

			// Values as an independent reader decodes them.
			checkF32 := func(name string, want ...float32) {
				t.Helper()
				b, err := c.Bytes(name)
				if err != nil {
					t.Fatal(err)
				}
				if got := f32s(b)[:len(want)]; !slices.Equal(got, want) {
					t.Errorf("%s starts %v, want %v", name, got, want)
				}
			}
			checkF32("scalar.f32", 3.5)
			checkF32(`weird\name."with"quotes`, 1, 2, 3)
			checkF32("plain.f32.2d", 0.0036904599983245134, 0.8962365984916687, -0.8224135637283325)
			checkF32("second.shard.f32", -0.3837008774280548, -0.29570621252059937)
			bf, _ := c.Bytes("plain.bf16.1d")
			if got := binary.LittleEndian.Uint16(bf); got != 0x7F80 { // +inf
				t.Errorf("plain.bf16.1d[0] = %#04x, want 0x7f80", got)
			}
			u8, _ := c.Bytes("second.shard.u8")
			if !bytes.HasPrefix(u8, []byte{3, 247, 193, 48, 109}) || len(u8) != 300 {
				t.Errorf("second.shard.u8 = %v...", u8[:5])
			}
			if b, err := c.Bytes("empty.f32"); err != nil || len(b) != 0 {
				t.Errorf("empty tensor: %d bytes, %v", len(b), err)
			}

			// ReadTensor agrees with Bytes for every tensor.
			for _, name := range c.Names() {
				ti, _ := c.Tensor(name)
				view, err := c.Bytes(name)
				if err != nil {
					t.Fatal(err)
				}
				dst := make([]byte, ti.Size)
				if err := c.ReadTensor(name, dst); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(view, dst) || int64(len(view)) != ti.Size || cap(view) != len(view) {
					t.Errorf("%s: Bytes and ReadTensor differ (len %d cap %d, size %d)", name, len(view), cap(view), ti.Size)
				}
			}
		})
	}
}

func TestBytesIsAViewOfTheMapping(t *testing.T) {
	if !canMap {
		t.Skip("no mmap on this platform")
	}
	c, err := Open(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, _ := c.Bytes("plain.f32.2d")
	b, _ := c.Bytes("plain.bf16.1d")
	again, _ := c.Bytes("plain.f32.2d")
	// plain.bf16.1d follows plain.f32.2d directly in the file, so views of
	// one mapping are 1024 bytes apart; copies would not be.
	if d := uintptr(unsafe.Pointer(&b[0])) - uintptr(unsafe.Pointer(&a[0])); d != 1024 {
		t.Errorf("adjacent tensors are %d bytes apart in memory: views are copies", d)
	}
	if &again[0] != &a[0] {
		t.Error("two views of one tensor differ")
	}
}

func TestTensorReturnsACopy(t *testing.T) {
	c, err := Open(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ti, ok := c.Tensor("rank3.f32")
	if !ok || !equalShape(ti.Shape, []int64{2, 3, 4}) {
		t.Fatalf("rank3.f32: %+v %v", ti, ok)
	}
	ti.Shape[0] = 99
	if again, _ := c.Tensor("rank3.f32"); again.Shape[0] != 2 {
		t.Error("changing a returned shape changed the checkpoint")
	}
	if _, ok := c.Tensor("nope"); ok {
		t.Error("unknown tensor found")
	}
}

func TestLookupErrors(t *testing.T) {
	c, err := Open(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bytes("nope"); !errors.Is(err, ErrMissing) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Bytes(nope): %v", err)
	}
	if err := c.ReadTensor("scalar.f32", make([]byte, 3)); err == nil || !strings.Contains(err.Error(), "3 bytes") {
		t.Errorf("short dst: %v", err)
	}
	if _, err := c.Runs([]string{"scalar.f32", "nope"}); !errors.Is(err, ErrMissing) {
		t.Errorf("Runs with an unknown name: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := c.Bytes("scalar.f32"); !errors.Is(err, ErrClosed) {
		t.Errorf("Bytes after Close: %v", err)
	}
	if err := c.ReadTensor("scalar.f32", make([]byte, 4)); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadTensor after Close: %v", err)
	}
	if _, err := c.Weight("x"); !errors.Is(err, ErrClosed) {
		t.Errorf("Weight after Close: %v", err)
	}
}

func TestReadTensorAfterTruncation(t *testing.T) {
	dir := copyFixture(t)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := os.Truncate(filepath.Join(dir, "model-00002-of-00002.safetensors"), 500); err != nil {
		t.Fatal(err)
	}
	err = c.ReadTensor("second.shard.u8", make([]byte, 300))
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "second.shard.u8") {
		t.Errorf("reading past a truncated end: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("empty directory: %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing directory: %v", err)
	}
	// A hostile shard fails Open with the shard's name.
	dir := copyFixture(t)
	bad := filepath.Join(dir, "model-00003-of-00003.safetensors")
	os.WriteFile(bad, withLen(1<<40, "{}"), 0o644)
	if _, err := Open(dir); !errors.Is(err, ErrHeaderSize) || !strings.Contains(err.Error(), bad) {
		t.Errorf("hostile third shard: %v", err)
	}
	// Two shards holding one tensor.
	dir = copyFixture(t)
	os.WriteFile(filepath.Join(dir, "extra.safetensors"), file(`{"scalar.f32": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}`, 4), 0o644)
	if _, err := Open(dir); !errors.Is(err, ErrDuplicate) || !strings.Contains(err.Error(), `"scalar.f32"`) {
		t.Errorf("tensor in two shards: %v", err)
	}
	// A directory named like a shard.
	dir = t.TempDir()
	os.Mkdir(filepath.Join(dir, "x.safetensors"), 0o755)
	os.WriteFile(filepath.Join(dir, "a.safetensors"), file(`{}`, 0), 0o644)
	if c, err := Open(dir); err != nil || len(c.Files()) != 1 {
		t.Errorf("directory named x.safetensors should be skipped: %v", err)
	}
}

// writeIndex writes an index for the fixture copy in dir, edited by edit.
func writeIndex(t *testing.T, dir string, edit func(m map[string]string)) {
	t.Helper()
	m := make(map[string]string)
	for name, s := range fixtureShards {
		for _, ti := range s.tensors {
			m[ti.Name] = name
		}
	}
	edit(m)
	if err := WriteIndex(filepath.Join(dir, IndexName), &Index{TotalSize: 1876 + 712, WeightMap: m}); err != nil {
		t.Fatal(err)
	}
}

func TestOpenWithIndex(t *testing.T) {
	dir := copyFixture(t)
	writeIndex(t, dir, func(map[string]string) {})
	// A stray shard the index does not name is not opened.
	os.WriteFile(filepath.Join(dir, "stray.safetensors"), withLen(1<<40, ""), 0o644)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(c.Names()) != 13 || len(c.Files()) != 2 {
		t.Errorf("%d names in %d files", len(c.Names()), len(c.Files()))
	}
	if b, err := c.Bytes(`weird\name."with"quotes`); err != nil || !slices.Equal(f32s(b), []float32{1, 2, 3}) {
		t.Errorf("weird name: %v %v", b, err)
	}
}

func TestOpenIndexCrossCheck(t *testing.T) {
	const s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	cases := []struct {
		name   string
		edit   func(m map[string]string)
		extra  func(dir string)
		kind   error
		tensor string
		says   string
	}{
		{"name mapped to a shard that lacks it", func(m map[string]string) { m["scalar.f32"] = s2 }, nil, ErrIndex, "scalar.f32", "maps it to " + s2},
		{"name no shard holds", func(m map[string]string) { m["ghost.weight"] = s1 }, nil, ErrMissing, "ghost.weight", "lacks it"},
		{"shard tensor missing from the index", func(m map[string]string) { delete(m, "rank4.u8") }, nil, ErrIndex, "rank4.u8", "does not list it"},
		{"entry naming a missing file", func(m map[string]string) { m["rank4.u8"] = "model-00009-of-00009.safetensors" }, nil, ErrIndex, "rank4.u8", "model-00009-of-00009.safetensors"},
		{"entry reaching outside the directory", func(m map[string]string) { m["rank4.u8"] = "../" + s1 }, nil, ErrIndex, "rank4.u8", "not a file name"},
		{"tensor present in two shards", func(m map[string]string) { m["dup"] = "dup.safetensors"; m["x"] = "x.safetensors" },
			func(dir string) {
				os.WriteFile(filepath.Join(dir, "dup.safetensors"), file(`{"dup": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}`, 1), 0o644)
				os.WriteFile(filepath.Join(dir, "x.safetensors"), file(`{"dup": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "x": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}`, 2), 0o644)
			}, ErrDuplicate, "dup", "also in"},
		{"empty weight_map", func(m map[string]string) { clear(m) }, nil, ErrIndex, "", "empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyFixture(t)
			writeIndex(t, dir, c.edit)
			if c.extra != nil {
				c.extra(dir)
			}
			ck, err := Open(dir)
			if err == nil {
				ck.Close()
				t.Fatal("accepted")
			}
			var e *Error
			if !errors.Is(err, c.kind) || !errors.As(err, &e) || e.Tensor != c.tensor || !strings.Contains(err.Error(), c.says) {
				t.Errorf("got %q; want %v naming tensor %q and saying %q", err, c.kind, c.tensor, c.says)
			}
		})
	}
	// A broken index is an error, not a reason to scan instead.
	dir := copyFixture(t)
	os.WriteFile(filepath.Join(dir, IndexName), []byte(`{"weight_map": [}`), 0o644)
	if _, err := Open(dir); !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), IndexName) {
		t.Errorf("broken index: %v", err)
	}
}

func TestRuns(t *testing.T) {
	c, err := Open(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f1, f2 := c.Files()[0], c.Files()[1]
	cases := []struct {
		names []string
		want  []Run
	}{
		{c.Names(), []Run{{f1, 1030, 1876}, {f2, 261, 712}}}, // each shard's data is one run
		{[]string{"rank4.u8", "plain.f32.2d", "plain.bf16.1d"}, []Run{{f1, 1030, 1280}, {f1, 1030 + 1860, 16}}},
		{[]string{"second.shard.u8", "scalar.f32", "second.shard.u8"}, []Run{{f1, 1030 + 1632, 4}, {f2, 261 + 400, 300}}},
		{[]string{"empty.f32"}, nil},
		{[]string{"scalar.f32", "empty.f32", "language_model.model.layers.0.block_sparse_moe.experts.0.w1.weight_packed"}, []Run{{f1, 1030 + 1632, 68}}},
		{nil, nil},
	}
	for _, cs := range cases {
		got, err := c.Runs(cs.names)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, cs.want) {
			t.Errorf("Runs(%q) = %v, want %v", cs.names, got, cs.want)
		}
	}
}

func TestGroupRuns(t *testing.T) {
	c, err := Open(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f1, f2 := c.Files()[0], c.Files()[1]
	// A layer key in the model package's style: layers.L. -> L; the
	// second shard's tensors go to a group of their own.
	key := func(name string) (int, bool) {
		if rest, ok := strings.CutPrefix(name, "language_model.model.layers."); ok {
			l, err := strconv.Atoi(rest[:strings.IndexByte(rest, '.')])
			return l, err == nil
		}
		if strings.HasPrefix(name, "second.") {
			return 7, true
		}
		return 0, false
	}
	got := c.GroupRuns(key)
	want := map[int][]Run{
		0: {{f1, 1030 + 1636, 128}},
		7: {{f2, 261, 700}},
	}
	if len(got) != len(want) {
		t.Fatalf("groups %v, want %v", got, want)
	}
	for g, w := range want {
		if !slices.Equal(got[g], w) {
			t.Errorf("group %d: %v, want %v", g, got[g], w)
		}
	}
}

func TestConcurrentReads(t *testing.T) {
	c, err := Open(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				name := c.Names()[(g+i)%len(c.Names())]
				view, err := c.Bytes(name)
				if err != nil {
					errs <- err
					return
				}
				dst := make([]byte, len(view))
				if err := c.ReadTensor(name, dst); err != nil || !bytes.Equal(dst, view) {
					errs <- errors.Join(err, errors.New(name+": views and reads differ"))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
