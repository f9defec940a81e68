package safetensors

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestReadReleasedIndex(t *testing.T) {
	idx, err := ReadIndex("testdata/k3-release/model.safetensors.index.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.WeightMap) != 497220 {
		t.Errorf("%d names, want 497,220", len(idx.WeightMap))
	}
	if idx.TotalSize != 1560860324864 {
		t.Errorf("total_size %d, want 1,560,860,324,864", idx.TotalSize)
	}
	shards := make(map[string]int)
	for _, f := range idx.WeightMap {
		shards[f]++
	}
	if len(shards) != 96 {
		t.Errorf("%d shards, want 96", len(shards))
	}
	for i := 1; i <= 96; i++ {
		if name := fmt.Sprintf("model-%05d-of-000096.safetensors", i); shards[name] == 0 {
			t.Errorf("no tensor in %s", name)
		}
	}
	// Placement (K3-SPEC 5.1): shard L+1 holds layer L, shard 94 the
	// embeddings and head.
	for name, want := range map[string]string{
		"language_model.model.layers.0.mlp.gate_proj.weight":                          "model-00001-of-000096.safetensors",
		"language_model.model.layers.12.block_sparse_moe.experts.895.w3.weight_scale": "model-00013-of-000096.safetensors",
		"language_model.model.layers.92.block_sparse_moe.experts.0.w2.weight_packed":  "model-00093-of-000096.safetensors",
		"language_model.model.embed_tokens.weight":                                    "model-00094-of-000096.safetensors",
		"language_model.lm_head.weight":                                               "model-00094-of-000096.safetensors",
		"language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed":   "model-00002-of-000096.safetensors",
	} {
		if got := idx.WeightMap[name]; got != want {
			t.Errorf("%s -> %q, want %q", name, got, want)
		}
	}
}

func TestIndexRoundTrip(t *testing.T) {
	idx := &Index{TotalSize: 123456789012, WeightMap: map[string]string{
		"b.weight": "model-00002-of-000002.safetensors", "a.weight": "model-00001-of-000002.safetensors",
		`odd "name" <&>`: "model-00001-of-000002.safetensors",
	}}
	for _, name := range []string{"model.safetensors.index.json", "model.safetensors.index.json.gz"} {
		path := filepath.Join(t.TempDir(), name)
		if err := WriteIndex(path, idx); err != nil {
			t.Fatal(err)
		}
		got, err := ReadIndex(path)
		if err != nil {
			t.Fatal(err)
		}
		if got.TotalSize != idx.TotalSize || len(got.WeightMap) != len(idx.WeightMap) {
			t.Fatalf("%s: read back %+v", name, got)
		}
		for k, v := range idx.WeightMap {
			if got.WeightMap[k] != v {
				t.Errorf("%s: %q -> %q, want %q", name, k, got.WeightMap[k], v)
			}
		}
		raw, _ := os.ReadFile(path)
		if strings.HasSuffix(name, ".gz") {
			zr, err := gzip.NewReader(bytes.NewReader(raw))
			if err != nil {
				t.Fatalf("%s is not gzip: %v", name, err)
			}
			var buf bytes.Buffer
			buf.ReadFrom(zr)
			raw = buf.Bytes()
		}
		// The released shape: metadata first, sorted names, two-space indent.
		want := "{\n  \"metadata\": {\n    \"total_size\": 123456789012\n  },\n  \"weight_map\": {\n" +
			"    \"a.weight\": \"model-00001-of-000002.safetensors\",\n" +
			"    \"b.weight\": \"model-00002-of-000002.safetensors\",\n" +
			"    \"odd \\\"name\\\" <&>\": \"model-00001-of-000002.safetensors\"\n  }\n}\n"
		if string(raw) != want {
			t.Errorf("%s:\n%s\nwant:\n%s", name, raw, want)
		}
		entries, _ := os.ReadDir(filepath.Dir(path))
		if len(entries) != 1 {
			t.Errorf("temporary files left: %v", entries)
		}
	}
}

func TestReadIndexErrors(t *testing.T) {
	gz := func(s string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(s))
		zw.Close()
		return b.Bytes()
	}
	cases := []struct {
		name   string
		data   []byte
		kind   error
		tensor string
	}{
		{"not JSON", []byte("hello"), ErrSyntax, ""},
		{"array", []byte("[]"), ErrSyntax, ""},
		{"no weight_map", []byte(`{"metadata": {"total_size": 4}}`), ErrSyntax, ""},
		{"weight_map not an object", []byte(`{"weight_map": ["a"]}`), ErrSyntax, ""},
		{"value not a string", []byte(`{"weight_map": {"a": 5}}`), ErrSyntax, "a"},
		{"empty file name", []byte(`{"weight_map": {"a": ""}}`), ErrSyntax, "a"},
		{"duplicate name", []byte(`{"weight_map": {"a": "x.safetensors", "b": "x.safetensors", "a": "x.safetensors"}}`), ErrDuplicate, "a"},
		{"two weight_maps", []byte(`{"weight_map": {}, "weight_map": {}}`), ErrSyntax, ""},
		{"negative total_size", []byte(`{"metadata": {"total_size": -1}, "weight_map": {}}`), ErrSyntax, ""},
		{"fractional total_size", []byte(`{"metadata": {"total_size": 1.5}, "weight_map": {}}`), ErrSyntax, ""},
		{"string total_size", []byte(`{"metadata": {"total_size": "12"}, "weight_map": {}}`), ErrSyntax, ""},
		{"trailing data", []byte(`{"weight_map": {}} x`), ErrSyntax, ""},
		{"truncated gzip", gz(`{"weight_map": {"a": "x.safetensors"}}`)[:20], nil, ""},
		{"truncated JSON in gzip", gz(`{"weight_map": {"a": "x.safe`), ErrSyntax, "a"},
	}
	for _, c := range cases {
		path := filepath.Join(t.TempDir(), IndexName)
		os.WriteFile(path, c.data, 0o644)
		_, err := ReadIndex(path)
		var e *Error
		switch {
		case err == nil:
			t.Errorf("%s: accepted", c.name)
		case c.kind != nil && !errors.Is(err, c.kind):
			t.Errorf("%s: %v is not %v", c.name, err, c.kind)
		case !errors.As(err, &e) || e.File != path || e.Tensor != c.tensor:
			t.Errorf("%s: %v does not name %s and tensor %q", c.name, err, path, c.tensor)
		}
	}
	// An exponent-form total_size is a byte count all the same.
	path := filepath.Join(t.TempDir(), IndexName)
	os.WriteFile(path, []byte(`{"metadata": {"total_size": 1.5e3, "other": "x"}, "weight_map": {"a": "x.safetensors"}, "extra": [1]}`), 0o644)
	if idx, err := ReadIndex(path); err != nil || idx.TotalSize != 1500 {
		t.Errorf("total_size 1.5e3: %+v %v", idx, err)
	}
}

func TestHasControl(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for range 20000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(0x20 + rng.IntN(0xE0))
			if rng.IntN(60) == 0 {
				b[i] = byte(rng.IntN(0x20))
			}
		}
		want := slices.ContainsFunc(b, func(c byte) bool { return c < 0x20 })
		if got := hasControl(b); got != want {
			t.Fatalf("hasControl(%q) = %v", b, got)
		}
	}
}

func TestReadIndexNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), IndexName)
	os.WriteFile(path, []byte("{\"weight_map\":{\"a\\\"b\\u00e9\\\\\":\"x.safetensors\",\"plain\":\"x.safetensors\",\"\\u0041\":\"y\\/z\"}}"), 0o644)
	idx, err := ReadIndex(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{`a"bé\`: "x.safetensors", "plain": "x.safetensors", "A": "y/z"}
	if !maps.Equal(idx.WeightMap, want) {
		t.Errorf("weight_map %q, want %q", idx.WeightMap, want)
	}
	for _, bad := range []string{"{\"weight_map\":{\"a\x01\":\"x\"}}", "{\"weight_map\":{\"a\":\"x\x1f\"}}", "{\"weight_map\":{\"a\xff\":\"x\"}}", "{\"weight_map\":{\"a\\q\":\"x\"}}", "{\"weight_map\":{\"a\":\"x"} {
		os.WriteFile(path, []byte(bad), 0o644)
		if _, err := ReadIndex(path); !errors.Is(err, ErrSyntax) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func BenchmarkReadReleasedIndex(b *testing.B) {
	for b.Loop() {
		idx, err := ReadIndex("testdata/k3-release/model.safetensors.index.json.gz")
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(idx.WeightMap)), "names")
	}
}
