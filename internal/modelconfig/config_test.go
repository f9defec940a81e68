package modelconfig

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/configs"
)

// edit returns the tiny preset with text_config changed by f.
func edit(t *testing.T, f func(text, linear map[string]any)) []byte {
	t.Helper()
	b, err := configs.ModelPreset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	text := cfg["text_config"].(map[string]any)
	f(text, text["linear_attn_config"].(map[string]any))
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPresetsAreWithinTheLimits(t *testing.T) {
	for _, name := range configs.ModelPresets() {
		b, _ := configs.ModelPreset(name)
		c, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if c.MaxPositions != DefaultMaxPositions {
			t.Errorf("%s: max positions %d", name, c.MaxPositions)
		}
	}
}

// TestHostileCountsAllocateNothing: a config claiming a billion layers (with
// and without the layer lists that would otherwise be filled in for every
// layer) or widths whose products overflow is refused naming the field,
// having allocated no more than its own size would justify.
func TestHostileCountsAllocateNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func(text, linear map[string]any)
		want string
	}{
		{"layers", func(x, _ map[string]any) { x["num_hidden_layers"] = 1_000_000_000 }, "num_hidden_layers is 1000000000, want 1..1024"},
		{"layers, no kda list", func(x, l map[string]any) { x["num_hidden_layers"] = 1_000_000_000; delete(l, "kda_layers") }, "num_hidden_layers is 1000000000"},
		{"negative layers", func(x, _ map[string]any) { x["num_hidden_layers"] = -1 }, "num_hidden_layers is -1"},
		{"vocab", func(x, _ map[string]any) { x["vocab_size"] = 1 << 40 }, "vocab_size is 1099511627776, want 1..4194304"},
		{"hidden", func(x, _ map[string]any) { x["hidden_size"] = 1 << 31 }, "hidden_size is 2147483648"},
		{"kda head dim", func(_, l map[string]any) { l["head_dim"] = 1 << 30 }, "linear_attn_config.head_dim is 1073741824"},
		{"kda heads", func(_, l map[string]any) { l["num_heads"] = 1 << 30 }, "linear_attn_config.num_heads is 1073741824"},
		{"conv", func(_, l map[string]any) { l["short_conv_kernel_size"] = 1 << 30 }, "short_conv_kernel_size is 1073741824"},
		{"a_log", func(_, l map[string]any) { l["a_log_stored_length"] = 1 << 30 }, "a_log_stored_length is 1073741824, more than 4096"},
		{"experts", func(x, _ map[string]any) { x["num_experts"] = 1 << 30 }, "num_experts is 1073741824"},
		{"shared experts", func(x, _ map[string]any) { x["num_shared_experts"] = 1 << 30 }, "num_shared_experts is 1073741824"},
		{"kv lora", func(x, _ map[string]any) { x["kv_lora_rank"] = 1 << 30 }, "kv_lora_rank is 1073741824"},
		{"positions", func(x, _ map[string]any) { x["max_position_embeddings"] = 1 << 40 }, "max_position_embeddings is 1099511627776"},
		{"block size", func(x, _ map[string]any) { x["attn_res_block_size"] = 1 << 30 }, "attn_res_block_size is 1073741824"},
		{"pad id", func(x, _ map[string]any) { x["vocab_size"] = 2 }, "pad_token_id is 2, outside the vocabulary 0..1"},
	} {
		b := edit(t, c.f)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := Parse(b)
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Errorf("%s: parsing a %d-byte config allocated %d bytes", c.name, len(b), grew)
		}
	}
}

// TestLayerListsMustCoverTheCount: within the limits, the lists decide.
func TestLayerListsMustCoverTheCount(t *testing.T) {
	b := edit(t, func(x, _ map[string]any) { x["num_hidden_layers"] = MaxLayers })
	if _, err := Parse(b); err == nil || !strings.Contains(err.Error(), "do not cover all 1024 layers") {
		t.Fatalf("got %v", err)
	}
}

// TestLongLayerListsAreRefusedLinearly: a kda_layers list of two million
// entries (once over 10 minutes to refuse: an error per entry, joined
// quadratically) is refused as a whole, in one line; a list of the full
// count whose every entry repeats one layer gets an error per entry, and
// its text lists the first 50 and counts the rest.
func TestLongLayerListsAreRefusedLinearly(t *testing.T) {
	huge := make([]int, 2_000_000)
	for i := range huge {
		huge[i] = 1
	}
	_, err := Parse(edit(t, func(_, l map[string]any) { l["kda_layers"] = huge }))
	if err == nil || !strings.Contains(err.Error(), "kda_layers lists 2000000 layers, more than the") {
		t.Fatalf("got %v", err)
	}
	if len(err.Error()) > 4096 {
		t.Fatalf("the error is %d bytes", len(err.Error()))
	}

	b := edit(t, func(x, l map[string]any) {
		x["num_hidden_layers"] = MaxLayers
		same := make([]int, MaxLayers)
		for i := range same {
			same[i] = 2
		}
		l["kda_layers"] = same
		l["full_attn_layers"] = []int{}
	})
	_, err = Parse(b)
	if err == nil || !strings.Contains(err.Error(), "layer 2 is also listed in kda_layers") || !strings.Contains(err.Error(), "... and ") {
		t.Fatalf("got %v", err)
	}
	if n := strings.Count(err.Error(), "\n"); n > maxShownProblems+1 {
		t.Fatalf("the error has %d lines, want at most %d", n+1, maxShownProblems+2)
	}
}
