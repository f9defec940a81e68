package modelinfo

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/model/safetensors"
)

func TestIdentityFollowsTheConfig(t *testing.T) {
	tiny, _ := configs.ModelPreset("tiny")
	small, _ := configs.ModelPreset("small")
	a, _ := Parse(tiny)
	b, _ := Parse(small)
	c, _ := Parse(tiny)
	if a.ID == b.ID || a.ID != c.ID || !strings.HasPrefix(a.ID, "m-") || HasTensors(a.ID) {
		t.Fatalf("ids %s %s %s", a.ID, b.ID, c.ID)
	}
	if _, err := Identity(t.TempDir()); err == nil {
		t.Fatal("identity of a directory without config.json")
	}
}

// resave writes config JSON b again as another tool might: indented, keys
// reordered by a map, numbers spelled otherwise.
func resave(t *testing.T, b []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(m, "", "    ")
	if err != nil {
		t.Fatal(err)
	}
	// 1e-05 is how encoding/json writes the eps; the release writes 1e-5.
	s := strings.ReplaceAll(string(out), "1e-05", "0.00001")
	return []byte("\n" + s + "\n\n")
}

func writeDir(t *testing.T, config []byte, tensors ...safetensors.WriteTensor) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), config, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(tensors) > 0 {
		if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, nil); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func tensor(name string, dt safetensors.DType, shape ...int64) safetensors.WriteTensor {
	n := int64(dt.Size())
	for _, d := range shape {
		n *= d
	}
	return safetensors.WriteTensor{Name: name, DType: dt, Shape: shape, Data: make([]byte, n)}
}

// TestIdentityIgnoresFormatting: re-saving config.json with other
// whitespace, key order and number spelling keeps the identity; changing a
// value that the computation reads changes it; a field tandem does not
// read does not.
func TestIdentityIgnoresFormatting(t *testing.T) {
	b, _ := configs.ModelPreset("k3")
	if !strings.Contains(string(b), "1e-5") && !strings.Contains(string(b), "1e-05") {
		t.Fatal("the K3 preset has no eps written as 1e-5: the number-spelling check would check nothing")
	}
	x := tensor("x", safetensors.BF16, 2, 3)
	id := func(config []byte) string {
		t.Helper()
		s, err := Identity(writeDir(t, config, x))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	orig := id(b)
	re := resave(t, b)
	if string(re) == string(b) {
		t.Fatal("the re-saved config is the same bytes")
	}
	if got := id(re); got != orig {
		t.Fatalf("re-saved config.json: identity %s, was %s", got, orig)
	}
	edit := func(f func(text map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		f(m["text_config"].(map[string]any))
		out, _ := json.Marshal(m)
		return out
	}
	if got := id(edit(func(m map[string]any) { m["rms_norm_eps"] = 2e-5 })); got == orig {
		t.Fatal("another rms_norm_eps kept the identity")
	}
	if got := id(edit(func(m map[string]any) { m["transformers_version"] = "9.9.9" })); got != orig {
		t.Fatalf("transformers_version changed the identity: %s, was %s", got, orig)
	}
}

// TestIdentityFollowsTheTensors: one config with tensors that differ in
// name, dtype or shape names different models; the same tensors in other
// shards (or another order) the same one.
func TestIdentityFollowsTheTensors(t *testing.T) {
	cfg, _ := configs.ModelPreset("tiny")
	id := func(dir string) string {
		t.Helper()
		s, err := Identity(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := id(writeDir(t, cfg, tensor("a", safetensors.BF16, 2, 3), tensor("b", safetensors.F32, 4)))
	if !HasTensors(base) {
		t.Fatalf("identity %s of a checkpoint has no tensor part", base)
	}
	for name, dir := range map[string]string{
		"dtype":  writeDir(t, cfg, tensor("a", safetensors.F32, 2, 3), tensor("b", safetensors.F32, 4)),
		"shape":  writeDir(t, cfg, tensor("a", safetensors.BF16, 3, 2), tensor("b", safetensors.F32, 4)),
		"name":   writeDir(t, cfg, tensor("a", safetensors.BF16, 2, 3), tensor("c", safetensors.F32, 4)),
		"tensor": writeDir(t, cfg, tensor("a", safetensors.BF16, 2, 3)),
	} {
		if got := id(dir); got == base {
			t.Errorf("another %s: same identity %s", name, got)
		} else if ConfigPart(got) != ConfigPart(base) {
			t.Errorf("another %s: config part %s, want %s", name, ConfigPart(got), ConfigPart(base))
		}
	}
	// The same tensors in another order and with other data.
	a := tensor("a", safetensors.BF16, 2, 3)
	a.Data[0] = 7
	if got := id(writeDir(t, cfg, tensor("b", safetensors.F32, 4), a)); got != base {
		t.Errorf("same tensors in another order: %s, want %s", got, base)
	}
	// A config alone names the config only, and matches both.
	only := id(writeDir(t, cfg))
	if HasTensors(only) || only != ConfigPart(base) {
		t.Fatalf("config-only identity %s, want %s", only, ConfigPart(base))
	}
}

// TestIdentityOfACheckpoint: a real synthetic checkpoint (the released
// layout, several shards with an index) gets the same identity from Load
// and Identity, one that covers its tensors.
func TestIdentityOfACheckpoint(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	id, err := Identity(dir)
	if err != nil {
		t.Fatal(err)
	}
	info, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != id || !HasTensors(id) {
		t.Fatalf("Load %s, Identity %s", info.ID, id)
	}
	// Another seed: the same tensor table, so the same identity.
	if other, err := Identity(testmodel.Dir(t, "tiny", 2, 2)); err != nil || other != id {
		t.Fatalf("seed 2: %s %v, want %s (values are not hashed)", other, err, id)
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"m-aaaaaaaaaaaa-111111111111", "m-aaaaaaaaaaaa-111111111111", true},
		{"m-aaaaaaaaaaaa-111111111111", "m-aaaaaaaaaaaa-222222222222", false},
		{"m-aaaaaaaaaaaa", "m-aaaaaaaaaaaa-222222222222", true},
		{"m-aaaaaaaaaaaa-222222222222", "m-aaaaaaaaaaaa", true},
		{"m-aaaaaaaaaaaa", "m-bbbbbbbbbbbb-222222222222", false},
		{"m-aaaaaaaaaaaa", "m-bbbbbbbbbbbb", false},
		{"other", "m-aaaaaaaaaaaa", false},
	} {
		if got := Match(c.a, c.b); got != c.want {
			t.Errorf("Match(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
