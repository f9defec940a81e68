package vision

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/mxfp"
)

// testConfig is a small tower of the released structure: head width 24
// (QKV differs from the width, as in K3), a 6x4 position table (not square,
// so that a swapped axis shows), patch 14, 2x2 merge; the text width is the
// tiny preset's.
func testConfig() *Config {
	c := K3(64)
	c.Hidden, c.Intermediate, c.Layers, c.Heads, c.QKV = 32, 64, 2, 2, 48
	c.PosH, c.PosW = 6, 4
	return &c
}

// visionJSON is c as a released vision_config.
func visionJSON(c *Config) map[string]any {
	return map[string]any{
		"vt_hidden_size": c.Hidden, "vt_intermediate_size": c.Intermediate, "vt_num_hidden_layers": c.Layers,
		"vt_num_attention_heads": c.Heads, "qkv_hidden_size": c.QKV, "patch_size": c.Patch,
		"init_pos_emb_height": c.PosH, "init_pos_emb_width": c.PosW, "init_pos_emb_time": 4,
		"merge_kernel_size": []int{c.MergeH, c.MergeW}, "merge_type": "sd2_tpool", "mm_hidden_size": c.Hidden,
		"mm_projector_type": "patchmergerv2", "norm_type": "rmsnorm", "activation_func": "gelu_pytorch_tanh",
		"projector_hidden_act": "gelu", "projector_ln_eps": 1e-5, "pos_emb_type": "divided_fixed",
		"pos_emb_interpolation_mode": "bilinear", "attn_bias": false, "linear_bias": false,
		"patch_embed_proj_bias": false, "text_hidden_size": c.TextHidden,
	}
}

// tensor is a test tensor's shape and values.
type tensor struct {
	shape []int64
	vals  []float32
}

// randomTensors draws every vision tensor of c: projections of std
// gain/√fan-in, norms 1 ± 0.2, the position table of std 0.5. Values are
// BF16-representable, so that BF16 files hold them exactly.
func randomTensors(c *Config, seed uint64) map[string]tensor {
	r := rand.New(rand.NewPCG(seed, 7))
	draw := func(mean, std float64, shape ...int64) tensor {
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = mxfp.BF16ToF32(mxfp.F32ToBF16(float32(mean + std*math.Sqrt(3)*(2*r.Float64()-1))))
		}
		return tensor{shape, v}
	}
	d, p := int64(c.Hidden), int64(c.Patch)
	lin := func(gain float64, out, in int64) tensor { return draw(0, gain/math.Sqrt(float64(in)), out, in) }
	m := map[string]tensor{
		namePatchEmbed: draw(0, 1/math.Sqrt(float64(3*p*p)), d, 3, p, p),
		namePosEmb:     draw(0, 0.5, int64(c.PosH), int64(c.PosW), d),
		nameFinalNorm:  draw(1, 0.2, d),
		nameProj0:      lin(2, int64(c.MergedWidth()), int64(c.MergedWidth())),
		nameProj2:      lin(1, int64(c.TextHidden), int64(c.MergedWidth())),
		namePostNorm:   draw(1, 0.2, int64(c.TextHidden)),
	}
	for i := 0; i < c.Layers; i++ {
		pre := BlockPrefix(i)
		m[pre+"norm0.weight"] = draw(1, 0.2, d)
		m[pre+"norm1.weight"] = draw(1, 0.2, d)
		m[pre+"wqkv.weight"] = lin(2, 3*int64(c.QKV), d) // scores of std ~4: a peaked softmax
		m[pre+"wo.weight"] = lin(1, d, int64(c.QKV))
		m[pre+"mlp.fc0.weight"] = lin(2, int64(c.Intermediate), d)
		m[pre+"mlp.fc1.weight"] = lin(1, d, int64(c.Intermediate))
	}
	return m
}

// writeCheckpoint writes config.json (the text config of the preset of
// vision's text_hidden_size: tiny 64, small 768, k3 7168; vision as its
// vision_config, nil leaves it out) and one BF16 shard of ts.
func writeCheckpoint(t testing.TB, dir string, vision map[string]any, ts map[string]tensor) {
	t.Helper()
	preset := "tiny"
	if vision != nil {
		preset = map[int]string{64: "tiny", 768: "small", 7168: "k3"}[vision["text_hidden_size"].(int)]
	}
	raw, err := configs.ModelPreset(preset)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if vision == nil {
		delete(cfg, "vision_config")
	} else {
		cfg["vision_config"] = vision
	}
	out, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	var wt []safetensors.WriteTensor
	for name, x := range ts {
		b := make([]byte, 2*len(x.vals))
		for i, v := range x.vals {
			binary.LittleEndian.PutUint16(b[2*i:], mxfp.F32ToBF16(v))
		}
		wt = append(wt, safetensors.WriteTensor{Name: name, DType: safetensors.BF16, Shape: x.shape, Data: b})
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model-00001-of-000001.safetensors"), wt, nil); err != nil {
		t.Fatal(err)
	}
}

// loadTest writes c's random tower into a temporary checkpoint and loads it
// on the CPU backend with 2 threads.
func loadTest(t testing.TB, c *Config, seed uint64) (*Tower, map[string]tensor) {
	t.Helper()
	ts := randomTensors(c, seed)
	dir := t.TempDir()
	writeCheckpoint(t, dir, visionJSON(c), ts)
	tw, err := Load(context.Background(), cpu.New(2), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tw.Close() })
	return tw, ts
}

// randomPatches draws an image's normalised pixels in [-1, 1].
func randomPatches(c *Config, gh, gw int, seed uint64) Patches {
	r := rand.New(rand.NewPCG(seed, 11))
	px := make([]float32, gh*gw*c.PatchValues())
	for i := range px {
		px[i] = float32(2*r.Float64() - 1)
	}
	return Patches{GridH: gh, GridW: gw, Pixels: px}
}

// maxErr is max |got − want| over max |want|.
func maxErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		panic(fmt.Sprintf("lengths %d and %d", len(got), len(want)))
	}
	var d, m float64
	for i, w := range want {
		d = max(d, math.Abs(float64(got[i])-w))
		m = max(m, math.Abs(w))
	}
	return d / m
}

func nan() float64 { return math.NaN() }
