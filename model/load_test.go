package model_test

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
)

// poke overwrites element i of tensor name in the checkpoint in dir with v.
func poke(t *testing.T, dir, name string, i int, v float32) {
	t.Helper()
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	info, ok := ck.Tensor(name)
	ck.Close()
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	var b []byte
	switch info.DType {
	case "F32":
		b = binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))
	case "BF16":
		b = binary.LittleEndian.AppendUint16(nil, uint16(math.Float32bits(v)>>16))
	default:
		t.Fatalf("tensor %s is %s", name, info.DType)
	}
	f, err := os.OpenFile(info.File, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, info.Offset+int64(i*len(b))); err != nil {
		t.Fatal(err)
	}
}

// TestNonFiniteWeightsAreRefusedByName: a NaN or an infinity in a tensor
// the loader reads (a norm, a conv kernel, the final norm) fails the load
// and names the tensor, instead of making every output NaN.
func TestNonFiniteWeightsAreRefusedByName(t *testing.T) {
	good := testmodel.Dir(t, "tiny", 1, 2)
	for _, c := range []struct {
		tensor string
		v      float32
		opt    model.LoadOptions
	}{
		{"language_model.model.layers.0.input_layernorm.weight", float32(math.NaN()), model.LoadOptions{Hi: 1}},
		{"language_model.model.layers.0.self_attn.q_conv1d.weight", float32(math.Inf(-1)), model.LoadOptions{Hi: 1}},
		{"language_model.model.norm.weight", float32(math.Inf(1)), model.LoadOptions{Lo: 0, Hi: 0, Head: true}},
	} {
		dir := testmodel.Copy(t, good)
		poke(t, dir, c.tensor, 3, c.v)
		m, err := model.Load(dir, cpu.New(1), c.opt)
		if err == nil {
			m.Close()
			t.Errorf("%s holding %v: loaded", c.tensor, c.v)
			continue
		}
		if !strings.Contains(err.Error(), "tensor "+c.tensor+": element 3 of") {
			t.Errorf("%s holding %v: %v", c.tensor, c.v, err)
		}
	}
	m, err := model.Load(good, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
	if err != nil {
		t.Fatalf("the unpoked checkpoint: %v", err)
	}
	m.Close()
}

// TestConfigCheckedAgainstTheCheckpoint: a config.json within the limits
// that counts more layers, or another vocabulary, than the checkpoint holds
// is refused when the checkpoint is opened, naming both.
func TestConfigCheckedAgainstTheCheckpoint(t *testing.T) {
	good := testmodel.Dir(t, "tiny", 1, 2)
	for _, c := range []struct {
		edit func(text map[string]any)
		want string
	}{
		{func(x map[string]any) {
			x["num_hidden_layers"] = 1000
			delete(x["linear_attn_config"].(map[string]any), "kda_layers")
		}, "config.json num_hidden_layers is 1000, but the checkpoint holds no tensor of layer 9"},
		{func(x map[string]any) {
			x["num_hidden_layers"] = 8
			l := x["linear_attn_config"].(map[string]any)
			l["full_attn_layers"], l["kda_layers"] = []int{4, 8}, []int{1, 2, 3, 5, 6, 7}
		}, "config.json num_hidden_layers is 8, but the checkpoint holds tensor language_model.model.layers.8."},
		{func(x map[string]any) { x["hidden_size"] = x["hidden_size"].(float64) * 2 }, "tensor language_model.model.embed_tokens.weight has shape"},
	} {
		dir := t.TempDir()
		ents, _ := os.ReadDir(good)
		for _, e := range ents {
			if e.Name() != "config.json" {
				if err := os.Symlink(filepath.Join(good, e.Name()), filepath.Join(dir, e.Name())); err != nil {
					t.Fatal(err)
				}
			}
		}
		b, _ := os.ReadFile(filepath.Join(good, "config.json"))
		var cfg map[string]any
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatal(err)
		}
		c.edit(cfg["text_config"].(map[string]any))
		b, _ = json.Marshal(cfg)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		_, ck, err := model.OpenCheckpoint(dir)
		if err == nil {
			ck.Close()
			t.Errorf("accepted; want %q", c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}
