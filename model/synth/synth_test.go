package synth_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/synth"
	"github.com/tandem-inference/tandem/tokenizer"
)

func writeTiny(t *testing.T, shards int, seed uint64) string {
	t.Helper()
	cfg, err := configs.ModelPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := synth.Write(context.Background(), cfg, dir, synth.Options{Seed: seed, Shards: shards, Force: true}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReleasedLayout: shard names, index, dtypes by role and each layer's
// trunk tensors in one contiguous run, as in the release (K3-SPEC §5).
func TestReleasedLayout(t *testing.T) {
	dir := writeTiny(t, 0, 1)
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	files := ck.Files()
	if len(files) != 12 { // 9 layers, the model-level shard, the projector's and the tower's
		t.Fatalf("%d shards, want 12", len(files))
	}
	name := regexp.MustCompile(`^model-\d{5}-of-\d{6}\.safetensors$`)
	for _, f := range files {
		if !name.MatchString(filepath.Base(f)) {
			t.Fatalf("shard %s is not named like the release", f)
		}
	}
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ck.Names() {
		info, _ := ck.Tensor(n)
		want := safetensors.BF16
		switch {
		case strings.HasSuffix(n, ".weight_packed"), strings.HasSuffix(n, ".weight_scale"):
			want = safetensors.U8
		case strings.Contains(n, "conv1d"), strings.HasSuffix(n, "A_log"), strings.HasSuffix(n, "dt_bias"),
			strings.HasSuffix(n, "o_norm.weight"), strings.HasSuffix(n, "e_score_correction_bias"):
			want = safetensors.F32
		}
		if info.DType != want {
			t.Fatalf("%s is %s, the release stores it as %s", n, info.DType, want)
		}
		if strings.Contains(n, ".experts.") && !strings.Contains(n, "shared") && info.DType != safetensors.U8 {
			t.Fatalf("routed expert %s is not MXFP4", n)
		}
	}
	// Layer L's non-expert tensors form one contiguous run.
	runs := model.LayerRuns(ck)
	for L := 0; L < cfg.NumLayers; L++ {
		var trunk []string
		for _, n := range ck.Names() {
			if l, ok := model.LayerOf(n); ok && l == L && !strings.Contains(n, ".experts.") {
				trunk = append(trunk, n)
			}
		}
		r, err := ck.Runs(trunk)
		if err != nil {
			t.Fatal(err)
		}
		if len(r) != 1 {
			t.Fatalf("layer %d trunk tensors are in %d runs, want 1", L, len(r))
		}
		if len(runs[L]) == 0 {
			t.Fatalf("layer %d has no byte runs", L)
		}
	}
	// Every layer binds, with MXFP4 experts.
	for L := 0; L < cfg.NumLayers; L++ {
		l, err := model.BindLayer(cfg, L, model.CheckpointSource{C: ck})
		if err != nil {
			t.Fatal(err)
		}
		if l.MoE != nil && l.MoE.Experts[0].W1.Format.String() != "MXFP4" {
			t.Fatalf("layer %d experts are %s", L, l.MoE.Experts[0].W1.Format)
		}
	}
}

// TestSameWeightsWhateverTheShards: a tensor's bytes depend only on the seed
// and its name.
func TestSameWeightsWhateverTheShards(t *testing.T) {
	a, b := writeTiny(t, 2, 7), writeTiny(t, 0, 7)
	c := writeTiny(t, 2, 8)
	ca, _ := safetensors.Open(a)
	cb, _ := safetensors.Open(b)
	cc, _ := safetensors.Open(c)
	defer ca.Close()
	defer cb.Close()
	defer cc.Close()
	names := ca.Names()
	if strings.Join(names, ",") != strings.Join(cb.Names(), ",") {
		t.Fatal("different tensor sets for different shard counts")
	}
	differs := 0
	for _, n := range names {
		x, _ := ca.Bytes(n)
		y, _ := cb.Bytes(n)
		z, _ := cc.Bytes(n)
		if string(x) != string(y) {
			t.Fatalf("%s differs between shard layouts", n)
		}
		if string(x) != string(z) {
			differs++
		}
	}
	if differs < len(names)/2 {
		t.Fatalf("seeds 7 and 8 share %d of %d tensors", len(names)-differs, len(names))
	}
}

func TestRefusesNonEmptyDir(t *testing.T) {
	cfg, _ := configs.ModelPreset("tiny")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := synth.Write(context.Background(), cfg, dir, synth.Options{Seed: 1})
	if !errors.Is(err, synth.ErrNotEmpty) {
		t.Fatalf("got %v, want ErrNotEmpty", err)
	}
	// --force replaces a model but leaves the user's own files alone.
	if err := synth.Write(context.Background(), cfg, dir, synth.Options{Seed: 1, Force: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err != nil {
		t.Fatal("force removed a file the generator did not write")
	}
}

// TestPresetsValidateAndSizes: every preset parses; small is 1-2 GB; medium
// exceeds 24 GiB (larger than this machine's RAM).
func TestPresetsValidateAndSizes(t *testing.T) {
	sizes := map[string]int64{}
	for _, p := range configs.ModelPresets() {
		b, _ := configs.ModelPreset(p)
		c, err := model.ParseConfig(b)
		if err != nil {
			t.Fatalf("preset %s: %v", p, err)
		}
		for _, x := range synth.Plan(c).All() {
			sizes[p] += x.Bytes()
		}
	}
	if s := sizes["small"]; s < 1<<30 || s > 2<<30 {
		t.Fatalf("small is %d bytes, want 1-2 GiB", s)
	}
	if s := sizes["medium"]; s <= 24<<30 {
		t.Fatalf("medium is %d bytes, want more than 24 GiB", s)
	}
	keys := make([]string, 0, len(sizes))
	for k := range sizes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%s: %.2f GiB", k, float64(sizes[k])/(1<<30))
	}
}

// TestTokenizerWhenTheVocabularyHoldsOne: a model whose vocabulary can
// hold 256 bytes, the 256 specials and merges ships a loadable tokenizer
// with the specials at the top; tiny's 256 ids cannot.
func TestTokenizerWhenTheVocabularyHoldsOne(t *testing.T) {
	dir := writeTiny(t, 2, 1)
	if _, err := os.Stat(filepath.Join(dir, "tiktoken.model")); err == nil {
		t.Fatal("tiny got a tokenizer it cannot hold")
	}
	b, _ := configs.ModelPreset("tiny")
	cfg := strings.Replace(string(b), `"vocab_size": 256`, `"vocab_size": 1024`, 1)
	dir = t.TempDir()
	if err := synth.Write(context.Background(), []byte(cfg), dir, synth.Options{Seed: 1, Shards: 2}); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 1024 {
		t.Fatalf("tokenizer vocabulary %d, want 1024", tok.VocabSize())
	}
	if id, ok := tok.SpecialID("<|end_of_msg|>"); !ok || id != 1024-256+2 {
		t.Fatalf("<|end_of_msg|> is %d (%v), want %d", id, ok, 1024-256+2)
	}
	ids := tok.Encode("hello tandem")
	text, err := tok.DecodeString(ids)
	if err != nil || text != "hello tandem" {
		t.Fatalf("round trip gave %q, %v", text, err)
	}
}

// TestExpertTensorOrder: within a shard each expert's tensors follow the
// released order w1, w2, w3 (packed, then scale), back to back.
func TestExpertTensorOrder(t *testing.T) {
	dir := writeTiny(t, 0, 1)
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p := "language_model.model.layers.1.block_sparse_moe.experts.0."
	order := []string{"w1.weight_packed", "w1.weight_scale", "w2.weight_packed", "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"}
	var prev safetensors.TensorInfo
	for i, n := range order {
		info, ok := ck.Tensor(p + n)
		if !ok {
			t.Fatalf("%s missing", p+n)
		}
		if i > 0 && info.Offset != prev.Offset+prev.Size {
			t.Fatalf("%s does not follow %s", n, order[i-1])
		}
		prev = info
	}
}

// logPortable has the bits of math.Log on amd64 (its assembly routine),
// for the values the generator takes logarithms of, so that checkpoints
// written before it existed are unchanged; on other architectures it is
// the definition.
func TestLogPortable(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("math.Log is the reference only on amd64")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 1<<16; i++ {
		x := 1 + 15*rng.Float64()
		if i < 4 {
			x = []float64{1, 16, math.Sqrt2, math.Sqrt2 / 2 * 4}[i]
		}
		if got, want := synth.LogPortable(x), math.Log(x); got != want {
			t.Fatalf("logPortable(%v) = %v, math.Log %v", x, got, want)
		}
	}
}

// roundLog2 is math.Round(math.Log2(x)), exactly: on the sides of every
// half-integer power of two, and equal to math's on exponent-uniform
// values (where math.Log2 is off by a bit only next to those sides).
func TestRoundLog2(t *testing.T) {
	for k := -1020; k <= 1020; k += 7 {
		at := math.Ldexp(math.Sqrt2/2, k) // just above 2^(k-0.5)
		if got := synth.RoundLog2(at); got != k {
			t.Fatalf("roundLog2(%v) = %d, want %d", at, got, k)
		}
		if got := synth.RoundLog2(math.Nextafter(at, 0)); got != k-1 {
			t.Fatalf("roundLog2(%v) = %d, want %d", math.Nextafter(at, 0), got, k-1)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 1<<16; i++ {
		x := math.Ldexp(0.5+0.5*rng.Float64(), rng.IntN(200)-100)
		if got, want := synth.RoundLog2(x), int(math.Round(math.Log2(x))); got != want {
			t.Fatalf("roundLog2(%v) = %d, math %d", x, got, want)
		}
	}
}
