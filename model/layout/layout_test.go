package layout

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/synth"
)

// copyDir copies a (small) checkpoint directory, so that a test can plant
// faults in it; the shared cache is never changed.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	des, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		if _, err := copyFile(context.Background(), filepath.Join(src, de.Name()), filepath.Join(dst, de.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// editHeader rewrites a shard's header JSON in place with edit, keeping
// its length (padded with spaces), so the data offsets stay true.
func editHeader(t *testing.T, path string, edit func(h map[string]map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b[:8])
	var h map[string]map[string]any
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	edit(h)
	nb, err := json.Marshal(h)
	if err != nil || uint64(len(nb)) > n {
		t.Fatalf("edited header: %d bytes (was %d): %v", len(nb), n, err)
	}
	copy(b[8:8+n], append(nb, bytes.Repeat([]byte(" "), int(n)-len(nb))...))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func problems(t *testing.T, dir string, r *Range) []string {
	t.Helper()
	rep, err := Verify(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range rep.Problems {
		out = append(out, p.String())
	}
	return out
}

func shardOf(t *testing.T, dir, tensor string) string {
	t.Helper()
	idx, err := safetensors.ReadIndex(filepath.Join(dir, safetensors.IndexName))
	if err != nil {
		t.Fatal(err)
	}
	f, ok := idx.WeightMap[tensor]
	if !ok {
		t.Fatalf("the index lacks %s", tensor)
	}
	return f
}

// TestVerifyFindsPlantedFaults: a clean synthetic checkpoint in the
// released layout verifies; a missing shard, a truncated shard, a wrong
// dtype, a wrong shape and a missing tensor are each reported naming the
// file, the tensor and what was expected and found; a layer range that
// does not need the broken shard still verifies.
func TestVerifyFindsPlantedFaults(t *testing.T) {
	src := testmodel.Dir(t, "tiny", 1, 0) // one shard per layer, as released
	cfg, err := model.LoadConfig(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Tensors != len(synth.Plan(cfg).All()) || len(rep.Shards) < cfg.NumLayers {
		t.Fatalf("clean checkpoint: %+v", rep)
	}
	layer2 := model.LayerPrefix(2) + "self_attention_res_proj.weight"
	layer4 := model.LayerPrefix(4) + "input_layernorm.weight"
	for _, tc := range []struct {
		name  string
		plant func(dir string) string // returns the shard it broke
		want  []string
	}{
		{"missing shard", func(dir string) string {
			f := shardOf(t, dir, layer2)
			if err := os.Remove(filepath.Join(dir, f)); err != nil {
				t.Fatal(err)
			}
			return f
		}, []string{": missing: the index maps ", "of the range's tensors to it"}},
		{"truncated shard", func(dir string) string {
			f := shardOf(t, dir, layer2)
			p := filepath.Join(dir, f)
			st, _ := os.Stat(p)
			if err := os.Truncate(p, st.Size()-10); err != nil {
				t.Fatal(err)
			}
			return f
		}, []string{"its header implies", "(truncated: 10 bytes missing)"}},
		{"wrong dtype", func(dir string) string {
			f := shardOf(t, dir, layer2)
			editHeader(t, filepath.Join(dir, f), func(h map[string]map[string]any) { h[layer2]["dtype"] = "F16" })
			return f
		}, []string{"tensor " + layer2 + ": dtype F16, the config implies BF16"}},
		{"wrong shape", func(dir string) string {
			f := shardOf(t, dir, layer2)
			editHeader(t, filepath.Join(dir, f), func(h map[string]map[string]any) {
				s := h[layer2]["shape"].([]any)
				h[layer2]["shape"] = []any{s[1], s[0]}
			})
			return f
		}, []string{"tensor " + layer2 + ": shape [", "the config implies [1 "}},
		{"missing tensor", func(dir string) string {
			p := filepath.Join(dir, safetensors.IndexName)
			idx, err := safetensors.ReadIndex(p)
			if err != nil {
				t.Fatal(err)
			}
			f := idx.WeightMap[layer2]
			delete(idx.WeightMap, layer2)
			if err := safetensors.WriteIndex(p, idx); err != nil {
				t.Fatal(err)
			}
			return f
		}, []string{safetensors.IndexName + ": tensor " + layer2 + ": missing: the config implies BF16 [1 ", "in the shard's header but not in the index"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyDir(t, src)
			broken := tc.plant(dir)
			got := strings.Join(problems(t, dir, nil), "\n")
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("problems do not say %q:\n%s", w, got)
				}
			}
			if tc.name != "missing tensor" && !strings.Contains(got, broken+":") {
				t.Errorf("problems do not name the shard %s:\n%s", broken, got)
			}
			// Layers 3-4 do not need layer 2's shard.
			if got := problems(t, dir, &Range{Lo: 3, Hi: 5}); len(got) > 0 {
				t.Errorf("layers 3-4, which do not need %s: %q", broken, got)
			}
			// Every layer's shard is its own here: layers 1-2 need it.
			if got := problems(t, dir, &Range{Lo: 1, Hi: 3}); len(got) == 0 {
				t.Error("layers 1-2 verify without the broken shard")
			}
		})
	}
	if shardOf(t, src, layer2) == shardOf(t, src, layer4) {
		t.Fatal("layers 2 and 4 share a shard: the range checks above check nothing")
	}
}

// TestVerifyK3AtFullSize: the released K3 layout at its real sizes (the
// sparse synthetic checkpoint: the released 96 files, headers and sizes)
// verifies, and its 1.56 TB of tensors are accounted for from the headers
// alone; a K3 shard truncated by one byte is found. A decode rank of four
// needs a quarter of the layers' shards, and the first and last also the
// model-level ones.
func TestVerifyK3AtFullSize(t *testing.T) {
	if testing.Short() {
		t.Skip("writes the K3 sparse layout once per machine (half a minute)")
	}
	src := testmodel.Sparse(t, "k3")
	rep, err := Verify(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, _ := Open(src)
	if !rep.OK() || rep.Tensors != len(synth.Plan(cfg).All()) {
		t.Fatalf("K3: %d tensors, problems %v", rep.Tensors, rep.Problems)
	}
	idx, err := safetensors.ReadIndex(filepath.Join(src, safetensors.IndexName))
	if err != nil {
		t.Fatal(err)
	}
	// The text tower's bytes: the index's total less the vision tower's.
	if rep.Bytes <= 1_500_000_000_000 || rep.Bytes > idx.TotalSize {
		t.Fatalf("K3 text tensors: %d bytes, index total %d", rep.Bytes, idx.TotalSize)
	}

	// One truncated shard, the rest links to the real files.
	dir := t.TempDir()
	victim := shardOf(t, src, model.LayerPrefix(50)+"input_layernorm.weight")
	des, _ := os.ReadDir(src)
	for _, de := range des {
		from, to := filepath.Join(src, de.Name()), filepath.Join(dir, de.Name())
		if de.Name() == victim {
			if _, err := stub(from, to); err != nil {
				t.Fatal(err)
			}
			st, _ := os.Stat(to)
			if err := os.Truncate(to, st.Size()-1); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.Symlink(from, to); err != nil {
			t.Skipf("symlinks: %v", err)
		}
	}
	got := problems(t, dir, &Range{Lo: 48, Hi: 52})
	if len(got) != 1 || !strings.Contains(got[0], victim+": ") || !strings.Contains(got[0], "(truncated: 1 bytes missing)") {
		t.Fatalf("truncated K3 shard: %q", got)
	}

	var all []string
	for r := range 4 {
		lo, hi := r*93/4, (r+1)*93/4
		// needed with the index read once (Needed reads it per call).
		for _, s := range needed(src, idx, Range{Lo: lo, Hi: hi, Globals: r == 0 || r == 3}) {
			if s.Size <= 0 {
				t.Fatalf("rank %d: %+v", r, s)
			}
			all = append(all, s.File)
		}
	}
	slices.Sort(all)
	all = slices.Compact(all)
	// Every text shard is some rank's; the vision tower's are nobody's.
	text := map[string]bool{}
	for name, f := range idx.WeightMap {
		if _, ok := model.LayerOf(name); ok {
			text[f] = true
		}
	}
	if len(all) != len(text) {
		t.Fatalf("the four ranks need %d shards, the text tower has %d", len(all), len(text))
	}
}

// TestCopyARanksShards: a decode rank's copy holds its shards whole and the
// others as header-only stubs: the rank's range verifies, another range is
// told which stub it needs, the identity is the whole checkpoint's, and
// the rank's layers load and compute as from the original.
func TestCopyARanksShards(t *testing.T) {
	src := testmodel.Dir(t, "tiny", 1, 0)
	dst := filepath.Join(t.TempDir(), "rank1")
	r := Range{Lo: 2, Hi: 5}
	if _, err := Copy(context.Background(), src, dst, r); err != nil {
		t.Fatal(err)
	}
	if got := problems(t, dst, &r); len(got) > 0 {
		t.Fatalf("the copied range: %q", got)
	}
	got := strings.Join(problems(t, dst, nil), "\n")
	if !strings.Contains(got, "a header-only stub: this directory holds the data of layers 2-4 only") {
		t.Fatalf("the whole model on a rank's copy: %s", got)
	}
	want, err := modelinfo.Identity(src)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := modelinfo.Identity(dst); err != nil || id != want {
		t.Fatalf("identity %s (%v), the checkpoint's %s", id, err, want)
	}
	// The copied shards are the same bytes; the stubs' data reads as zeros.
	for _, s := range needed(src, mustIndex(t, src), r) {
		a, _ := os.ReadFile(filepath.Join(src, s.File))
		b, _ := os.ReadFile(filepath.Join(dst, s.File))
		if !bytes.Equal(a, b) {
			t.Fatalf("shard %s differs in the copy", s.File)
		}
	}
	m1, err := model.Load(src, cpu.New(1), model.LoadOptions{Lo: r.Lo, Hi: r.Hi})
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Close()
	m2, err := model.Load(dst, cpu.New(1), model.LoadOptions{Lo: r.Lo, Hi: r.Hi})
	if err != nil {
		t.Fatalf("loading the rank's layers from its copy: %v", err)
	}
	defer m2.Close()
	for _, name := range m1.Checkpoint.Names() {
		if !r.Holds(name) {
			continue
		}
		a, _ := m1.Checkpoint.Bytes(name)
		b, _ := m2.Checkpoint.Bytes(name)
		if !bytes.Equal(a, b) {
			t.Fatalf("tensor %s differs", name)
		}
	}
	// The whole model from the rank's copy is refused where it needs a
	// stub's data, naming the stub: it would read zeros for weights.
	m3, err := model.Load(dst, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
	if err == nil {
		m3.Close()
		t.Fatal("the whole model loaded from a rank's copy")
	}
	var se *safetensors.Error
	if !errors.Is(err, safetensors.ErrStub) || !errors.As(err, &se) || !slices.Contains(stubs(t, dst), filepath.Base(se.File)) {
		t.Fatalf("the whole model from a rank's copy: %v, want the stub named", err)
	}
	// A non-empty destination is refused.
	if _, err := Copy(context.Background(), src, dst, r); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("copy into a non-empty directory: %v", err)
	}
}

// stubs is the stubs CopyFile names in dir.
func stubs(t *testing.T, dir string) []string {
	t.Helper()
	c, err := readCopied(dir)
	if err != nil || c == nil {
		t.Fatalf("%s: %v", CopyFile, err)
	}
	return c.Stubs
}

func mustIndex(t *testing.T, dir string) *safetensors.Index {
	t.Helper()
	idx, err := safetensors.ReadIndex(filepath.Join(dir, safetensors.IndexName))
	if err != nil {
		t.Fatal(err)
	}
	return idx
}
