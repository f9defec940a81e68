package synth_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/internal/diskfree"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/synth"
)

// Released K3 figures (K3-SPEC §5.1): tensor bytes (the index's
// total_size) and the 96 files' bytes with their headers.
const (
	k3TensorBytes = 1_560_860_324_864
	k3FileBytes   = 1_560_936_091_448
)

// TestK3SparseIsTheRelease: the sparse K3 checkpoint has the released
// index (every name in its released shard), the released data size, and
// headers that bring the files to the released byte count exactly (the
// released order and header form: no metadata, padded to 8), yet takes
// almost no disk. Its per-layer byte-run index puts each layer in one run
// of its own shard (L+1), the trunk before the experts, whose offsets reach
// past 2^32; the model-level tensors are in shard 94; layer 0 binds at its
// real shapes.
func TestK3SparseIsTheRelease(t *testing.T) {
	dir := testmodel.Sparse(t, "k3")
	got, err := safetensors.ReadIndex(filepath.Join(dir, safetensors.IndexName))
	if err != nil {
		t.Fatal(err)
	}
	want, err := safetensors.ReadIndex("../safetensors/testdata/k3-release/model.safetensors.index.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	if got.TotalSize != k3TensorBytes || want.TotalSize != k3TensorBytes {
		t.Fatalf("total_size %d, released %d, want %d", got.TotalSize, want.TotalSize, int64(k3TensorBytes))
	}
	if len(got.WeightMap) != len(want.WeightMap) {
		t.Fatalf("%d names, the release has %d", len(got.WeightMap), len(want.WeightMap))
	}
	for name, file := range want.WeightMap {
		if got.WeightMap[name] != file {
			t.Fatalf("%s is in %q, the release has it in %q", name, got.WeightMap[name], file)
		}
	}
	var size, used int64
	shards := 0
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		u, ok := diskfree.Allocated(p)
		if !ok {
			t.Skip("this platform does not report allocated blocks")
		}
		used += u
		if strings.HasSuffix(e.Name(), ".safetensors") {
			fi, _ := e.Info()
			size += fi.Size()
			shards++
		}
	}
	if shards != 96 || size != k3FileBytes {
		t.Fatalf("%d shards of %d bytes, the release has 96 of %d", shards, size, int64(k3FileBytes))
	}
	if used > 256<<20 {
		t.Fatalf("the sparse checkpoint takes %d bytes of disk: its data was written", used)
	}
	t.Logf("%d shards, %d bytes, %.1f MiB on disk", shards, size, float64(used)/(1<<20))

	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	plan := synth.Plan(cfg)
	runs := model.LayerRuns(ck)
	if len(runs) != cfg.NumLayers+1 {
		t.Fatalf("%d groups of runs, want %d layers and the model-level group", len(runs), cfg.NumLayers+1)
	}
	var largest int64
	for L := 0; L < cfg.NumLayers; L++ {
		var bytes int64
		for _, x := range plan.Layers[L] {
			bytes += x.Bytes()
		}
		r := runs[L]
		file := fmt.Sprintf("model-%05d-of-000096.safetensors", L+1)
		h, _ := ck.Header(filepath.Join(dir, file))
		if len(r) != 1 || filepath.Base(r[0].File) != file || h == nil || r[0].Offset != h.DataStart || r[0].Length != bytes {
			t.Fatalf("layer %d runs %+v, want all %d bytes of %s's data in one run", L, r, bytes, file)
		}
		largest = max(largest, bytes)
	}
	if largest < 16_900_000_000 || largest > 17_100_000_000 {
		t.Fatalf("largest layer %d bytes, want about 17 GB", largest)
	}
	if g := runs[model.GlobalsGroup]; len(g) != 1 || filepath.Base(g[0].File) != "model-00094-of-000096.safetensors" {
		t.Fatalf("model-level runs %+v, want one run in shard 94", g)
	}
	e, ok := ck.Tensor("language_model.model.layers.1.block_sparse_moe.experts.895.w3.weight_scale")
	if !ok || e.Offset <= 1<<32 {
		t.Fatalf("expert 895 of layer 1 at offset %d, want past 2^32", e.Offset)
	}
	q, _ := ck.Tensor("language_model.model.layers.1.self_attn.q_proj.weight")
	e0, _ := ck.Tensor("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed")
	if q.Offset >= e0.Offset {
		t.Fatalf("layer 1's trunk (q_proj at %d) is not before its experts (%d)", q.Offset, e0.Offset)
	}
	if _, err := model.BindLayer(cfg, 0, model.CheckpointSource{C: ck}); err != nil {
		t.Fatal(err)
	}
}

// TestSparseHasTheDenseHeaders: a sparse write has byte for byte the
// headers and sizes of the dense write of the same config (the vision
// tower's two shards included) and reads as zeros.
func TestSparseHasTheDenseHeaders(t *testing.T) {
	cfg, _ := configs.ModelPreset("tiny")
	dense := writeTiny(t, 0, 1)
	sparse := t.TempDir()
	if err := synth.Write(context.Background(), cfg, sparse, synth.Options{Seed: 1, Sparse: true, Force: true}); err != nil {
		t.Fatal(err)
	}
	dc, err := safetensors.Open(dense)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	sc, err := safetensors.Open(sparse)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	df, sf := dc.Files(), sc.Files()
	if len(sf) != len(df) {
		t.Fatalf("%d sparse shards, want the %d dense ones", len(sf), len(df))
	}
	for i, f := range df {
		a, b := header(t, f), header(t, sf[i])
		if !bytes.Equal(a, b) {
			t.Fatalf("shard %d: sparse header differs from the dense one", i+1)
		}
		if bytes.Contains(a, []byte("__metadata__")) {
			t.Fatalf("shard %d has header metadata; the release has none", i+1)
		}
		x, _ := os.Stat(f)
		y, _ := os.Stat(sf[i])
		if x.Size() != y.Size() {
			t.Fatalf("shard %d: sparse %d bytes, dense %d", i+1, y.Size(), x.Size())
		}
	}
	// Holes on purpose, not a rank's copy (no safetensors.StubsFile): every
	// tensor reads, as zeros.
	if st := sc.Stubs(); len(st) != 0 {
		t.Fatalf("a sparse checkpoint has stubs: %q", st)
	}
	for _, n := range dc.Names() {
		b, err := sc.Bytes(n)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("%s is not all zeros", n)
		}
	}
	if _, ok := sc.Tensor("vision_tower.encoder.blocks.1.wqkv.weight"); !ok {
		t.Fatal("no vision tower in the sparse checkpoint")
	}
	if info, _ := sc.Tensor("mm_projector.proj.2.weight"); filepath.Base(info.File) != "model-00011-of-000012.safetensors" {
		t.Fatalf("projector in %s, want the second to last shard", info.File)
	}
}

// header returns a safetensors file's length prefix and JSON header.
func header(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n [8]byte
	if _, err := io.ReadFull(f, n[:]); err != nil {
		t.Fatal(err)
	}
	h := make([]byte, binary.LittleEndian.Uint64(n[:]))
	if _, err := io.ReadFull(f, h); err != nil {
		t.Fatal(err)
	}
	return append(n[:], h...)
}
