package safetensors

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

var writeSeeds = flag.Bool("write-fuzz-seeds", false, "rewrite testdata/fuzz/FuzzParseHeader from the hostile-case table")

// FuzzParseHeader feeds arbitrary files to the header parser: it must never
// panic or hang, must fail with an *Error, and whatever it accepts must
// satisfy every promise of Header.
func FuzzParseHeader(f *testing.F) {
	for name := range fixtureShards {
		b, err := os.ReadFile(filepath.Join(fixtureDir, name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ParseHeader(bytes.NewReader(data), int64(len(data)), "fuzz.safetensors")
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.File != "fuzz.safetensors" {
				t.Fatalf("error %v is not an *Error naming the file", err)
			}
			return
		}
		checkHeaderInvariants(t, h, int64(len(data)))
	})
}

func checkHeaderInvariants(t *testing.T, h *Header, fileSize int64) {
	if h.DataStart < 8 || h.DataStart > fileSize {
		t.Fatalf("DataStart %d outside [8, %d]", h.DataStart, fileSize)
	}
	seen := make(map[string]bool)
	var end int64
	for i, ti := range h.Tensors {
		if seen[ti.Name] || ti.Name == metadataKey {
			t.Fatalf("name %q accepted twice or reserved", ti.Name)
		}
		seen[ti.Name] = true
		if ti.DType.Size() == 0 {
			t.Fatalf("%q: unknown dtype %q accepted", ti.Name, ti.DType)
		}
		if n, err := byteSize(ti.DType, ti.Shape); err != nil || n != ti.Size {
			t.Fatalf("%q: size %d, shape %v of %s gives %d (%v)", ti.Name, ti.Size, ti.Shape, ti.DType, n, err)
		}
		if ti.Offset < h.DataStart || ti.Offset+ti.Size > fileSize || ti.Size < 0 {
			t.Fatalf("%q: bytes [%d, %d) outside the data section [%d, %d)", ti.Name, ti.Offset, ti.Offset+ti.Size, h.DataStart, fileSize)
		}
		if i > 0 && ti.Offset < h.Tensors[i-1].Offset {
			t.Fatalf("tensors not sorted by offset at %q", ti.Name)
		}
		if ti.Size > 0 {
			if ti.Offset < end {
				t.Fatalf("%q overlaps an earlier tensor", ti.Name)
			}
			end = ti.Offset + ti.Size
		}
	}
}

// FuzzParseIndex does the same for the index parser.
func FuzzParseIndex(f *testing.F) {
	f.Add([]byte(`{"metadata": {"total_size": 12}, "weight_map": {"a": "x.safetensors", "b": "y.safetensors"}}`))
	f.Add([]byte(`{"weight_map": {"a": "x", "a": "x"}}`))
	f.Add([]byte(`{"metadata": {"total_size": 1e400}, "weight_map": {}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, tensor, err := parseIndex(data)
		if err != nil {
			return
		}
		if tensor != "" || idx.TotalSize < 0 || idx.WeightMap == nil {
			t.Fatalf("accepted with tensor %q, total %d, map %v", tensor, idx.TotalSize, idx.WeightMap)
		}
		for k, v := range idx.WeightMap {
			if v == "" {
				t.Fatalf("%q maps to an empty file name", k)
			}
		}
	})
}

// TestFuzzSeedCorpus keeps the committed seed corpus in step with the
// hostile-case table: every case must be a seed (go test -run
// TestFuzzSeedCorpus -write-fuzz-seeds rewrites them).
func TestFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzParseHeader")
	seeds := map[string][]byte{}
	for i, c := range hostileCases() {
		seeds[fmt.Sprintf("hostile-%02d", i)] = c.data
	}
	seeds["valid-padded"] = file(`{"__metadata__": {"format": "pt"}, "a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}, "b": {"dtype": "F8_E4M3", "shape": [], "data_offsets": [8, 9]}}   `, 9)
	seeds["valid-empty"] = file(`{}`, 0)
	seeds["valid-zero-size"] = file(`{"z": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}`, 1)
	if *writeSeeds {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range seeds {
			body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(data)) + ")\n"
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, data := range seeds {
		body, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("seed %s missing (run with -write-fuzz-seeds): %v", name, err)
		}
		if want := "go test fuzz v1\n[]byte(" + strconv.Quote(string(data)) + ")\n"; string(body) != want {
			t.Errorf("seed %s is stale (run with -write-fuzz-seeds)", name)
		}
	}
}
