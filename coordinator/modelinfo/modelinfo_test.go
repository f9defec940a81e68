package modelinfo

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/model"
)

func TestReleasedK3(t *testing.T) {
	b, err := configs.ModelPreset("k3")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.NumLayers != 93 || m.VocabSize != 163840 || len(m.MLALayers) != 24 || len(m.KDALayers) != 69 {
		t.Fatalf("K3: %d layers (%d MLA, %d KDA), vocab %d", m.NumLayers, len(m.MLALayers), len(m.KDALayers), m.VocabSize)
	}
	if m.MLALayers[0] != 3 || m.MLALayers[23] != 92 {
		t.Fatalf("MLA layers %v: want 0-based 3, 7, ..., 92", m.MLALayers)
	}
	if m.EOSTokenID != 163586 || m.MaxPositions != 1<<20 {
		t.Fatalf("eos %d, max positions %d", m.EOSTokenID, m.MaxPositions)
	}
	// K3-SPEC §4: 27,648 B/token of latent rows; 434,110,464 B of KDA
	// state plus 69 x 3 x 12288 x 3 x 4 B of fp32 conv tails; the last
	// layer (MLA) 1,152 B/token.
	sh := m.Cost.Shape
	if sh.StateBytesPerToken != 27648 || sh.StateBytesFixed != 434110464.0+69*3*12288*3*4 ||
		sh.LastLayerBytesPerToken != 1152 || sh.LastLayerBytesFixed != 0 {
		t.Fatalf("shape %+v", sh)
	}
}

// hostile returns the tiny preset with text_config changed by edit.
func hostile(t *testing.T, edit func(text map[string]any)) []byte {
	t.Helper()
	b, err := configs.ModelPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	edit(cfg["text_config"].(map[string]any))
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func linearAttn(text map[string]any) map[string]any {
	return text["linear_attn_config"].(map[string]any)
}

// TestBadConfigsSayWhat: the coordinator refuses a bad config naming the
// field, and with the very words the workers use: one validation.
func TestBadConfigsSayWhat(t *testing.T) {
	for _, c := range []struct {
		cfg  []byte
		want string
	}{
		{[]byte(`{`), "not valid JSON"},
		{[]byte(`{"text_config": {}}`), "text_config.num_hidden_layers is missing"},
		{hostile(t, func(x map[string]any) { delete(x, "linear_attn_config") }), "text_config.linear_attn_config is missing"},
		{hostile(t, func(x map[string]any) { linearAttn(x)["kda_layers"] = []int{99} }), "kda_layers holds layer 99, outside 1..9"},
		{hostile(t, func(x map[string]any) { linearAttn(x)["kda_layers"] = []int{1} }), "do not cover all 9 layers"},
		{hostile(t, func(x map[string]any) { x["num_hidden_layers"] = 0 }), "num_hidden_layers is 0, want 1..1024"},
		{hostile(t, func(x map[string]any) { x["num_hidden_layers"] = 1_000_000_000 }), "num_hidden_layers is 1000000000, want 1..1024"},
		{hostile(t, func(x map[string]any) { x["vocab_size"] = 1 << 40 }), "vocab_size is 1099511627776, want 1..4194304"},
		{hostile(t, func(x map[string]any) { linearAttn(x)["head_dim"] = 1 << 20 }), "linear_attn_config.head_dim is 1048576"},
		{hostile(t, func(x map[string]any) { x["max_position_embeddings"] = 1 }), "max_position_embeddings is 1, want 2.."},
		{hostile(t, func(x map[string]any) { x["hidden_act"] = "gelu" }), "hidden_act"},
	} {
		_, err := Parse(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.80s: got %v, want %q", c.cfg, err, c.want)
			continue
		}
		_, werr := model.ParseConfig(c.cfg)
		if werr == nil || werr.Error() != err.Error() {
			t.Errorf("%.80s: the coordinator says %q, the workers %v", c.cfg, err, werr)
		}
	}
}

// TestStateBytesMatchesTheDecodeRanks: the coordinator's estimate of a
// sequence's state equals what a decode rank reserves (rank.StateBytes, on
// the model package's own parts).
func TestStateBytesMatchesTheDecodeRanks(t *testing.T) {
	for _, preset := range []string{"tiny", "demo", "k3"} {
		b, _ := configs.ModelPreset(preset)
		info, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		mc, err := model.ParseConfig(b)
		if err != nil {
			t.Fatal(err)
		}
		half := info.NumLayers / 2
		for _, r := range [][2]int{{0, half}, {half, info.NumLayers}} {
			for _, n := range []int{0, 1, 1000} {
				if got, want := info.StateBytes(r[0], r[1], n), rank.StateBytes(mc, r[0], r[1], n, model.BF16); got != want {
					t.Fatalf("%s layers %v, %d tokens: %d bytes, decode rank reserves %d", preset, r, n, got, want)
				}
				// A tensor rank's share: its KDA slices, the MLA rows whole.
				s := model.Shard{Rank: 1, Ranks: 2}
				if got, want := info.ShardStateBytes(r[0], r[1], n, 2), rank.ShardStateBytes(mc, r[0], r[1], n, model.BF16, s); got != want {
					t.Fatalf("%s layers %v, %d tokens, %s: %d bytes, decode rank reserves %d", preset, r, n, s, got, want)
				}
			}
		}
		budget := info.StateBytes(0, half, 5000) + 10
		if got := info.MaxTokens(0, half, budget); got != 5000 {
			t.Fatalf("%s: %d tokens fit, want 5000", preset, got)
		}
		if got := info.MaxShardTokens(0, half, info.ShardStateBytes(0, half, 5000, 2)+10, 2); got != 5000 {
			t.Fatalf("%s: %d tokens fit on a tensor rank, want 5000", preset, got)
		}
		if info.MaxTokens(0, half, 0) != info.MaxPositions || info.MaxTokens(0, half, 1) != 0 {
			t.Fatalf("%s: unlimited or tiny budgets", preset)
		}
	}
}

func TestVision(t *testing.T) {
	b, err := configs.ModelPreset("k3")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Vision {
		t.Error("K3's config has a vision_config: Vision is false")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"null", "{}", ""} {
		if v == "" {
			delete(top, "vision_config")
		} else {
			top["vision_config"] = json.RawMessage(v)
		}
		nb, _ := json.Marshal(top)
		m, err := Parse(nb)
		if err != nil {
			t.Fatal(err)
		}
		if m.Vision {
			t.Errorf("vision_config %q: Vision is true", v)
		}
	}
}
