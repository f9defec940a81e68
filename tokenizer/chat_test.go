package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The K3 chat goldens: testdata/k3chat/expected.json holds, for each
// conversation of conversations.json, the segments and ids that Moonshot's
// released renderer (encoding_k3.py) and npm tiktoken produced; see the
// README there.
const k3chatDir = "testdata/k3chat"

type k3Case struct {
	Name                string          `json:"name"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	Request             json.RawMessage `json:"request"`
}

type k3Expected struct {
	Model struct {
		ModelSHA256  string `json:"model_sha256"`
		ConfigSHA256 string `json:"config_sha256"`
	} `json:"model"`
	Cases []struct {
		Name     string    `json:"name"`
		Segments []Segment `json:"segments"`
		IDs      []int     `json:"ids"`
	} `json:"cases"`
}

// k3Chats returns the golden conversations as Chats, by name, in order.
func k3Chats(t testing.TB) ([]string, map[string]*Chat) {
	t.Helper()
	var in struct {
		Cases []k3Case `json:"cases"`
	}
	b, err := os.ReadFile(filepath.Join(k3chatDir, "conversations.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &in); err != nil {
		t.Fatal(err)
	}
	var names []string
	chats := map[string]*Chat{}
	for _, c := range in.Cases {
		var chat Chat
		if err := json.Unmarshal(c.Request, &chat); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		chat.NoGenerationPrompt = c.AddGenerationPrompt != nil && !*c.AddGenerationPrompt
		names = append(names, c.Name)
		chats[c.Name] = &chat
	}
	return names, chats
}

func TestRenderChatMatchesTheReleasedRenderer(t *testing.T) {
	tok := testTokenizer(t, "k3")
	names, chats := k3Chats(t)
	var want k3Expected
	b, err := os.ReadFile(filepath.Join(k3chatDir, "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Cases) != len(names) || len(names) < 40 {
		t.Fatalf("%d expected cases for %d conversations (at least 40 wanted): run testdata/k3chat/generate.sh", len(want.Cases), len(names))
	}
	dir, err := goldenModels()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ name, sum string }{{ModelFile, want.Model.ModelSHA256}, {ConfigFile, want.Model.ConfigSHA256}} {
		if got := fileSHA256(t, filepath.Join(dir, "k3", f.name)); got != f.sum {
			t.Fatalf("the synthetic %s differs from the one the goldens were made with (sha256 %s, want %s)", f.name, got, f.sum)
		}
	}
	for i, w := range want.Cases {
		if w.Name != names[i] {
			t.Fatalf("case %d is %q in expected.json, %q in conversations.json", i, w.Name, names[i])
		}
		segs, err := RenderChat(chats[w.Name])
		if err != nil {
			t.Errorf("%s: %v", w.Name, err)
			continue
		}
		if !reflect.DeepEqual(segs, w.Segments) {
			for j := range min(len(segs), len(w.Segments)) {
				if segs[j] != w.Segments[j] {
					t.Errorf("%s: segment %d is %+v, want %+v", w.Name, j, segs[j], w.Segments[j])
					break
				}
			}
			t.Errorf("%s: %d segments, want %d", w.Name, len(segs), len(w.Segments))
			continue
		}
		ids, err := tok.EncodeChat(chats[w.Name])
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(ids, w.IDs) {
			t.Errorf("%s: ids differ from the released renderer's (%d ids, want %d)", w.Name, len(ids), len(w.IDs))
		}
	}
}

// TestK3GoldenIDsLive re-encodes the committed segments with npm tiktoken
// (when setup.sh installed it) and compares with the committed ids, so
// that the ids are the reference tokenizer's, not hand-made.
func TestK3GoldenIDsLive(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if _, err := os.Stat(filepath.Join(goldenDir, "node_modules", "tiktoken")); err != nil {
		t.Skip("npm tiktoken not installed (scripts/setup.sh installs it)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found")
	}
	dir, err := goldenModels()
	if err != nil {
		t.Fatal(err)
	}
	var committed k3Expected
	readJSON(t, filepath.Join(k3chatDir, "expected.json"), &committed)
	segs := filepath.Join(t.TempDir(), "segments.json")
	b, err := json.Marshal(committed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(segs, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, filepath.Join(k3chatDir, "encode.cjs"), segs, filepath.Join(dir, "k3"))
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(goldenDir, "node_modules"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("encode.cjs: %v", err)
	}
	var live k3Expected
	if err := json.Unmarshal(out, &live); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(live, committed) {
		t.Fatal("npm tiktoken's ids for the committed segments differ from the committed ids: run testdata/k3chat/generate.sh")
	}
}

func TestRenderChatErrors(t *testing.T) {
	for name, c := range map[string]Chat{
		"effort":          {ReasoningEffort: "extreme", Messages: []ChatMessage{{Role: "user"}}},
		"tool name":       {Messages: []ChatMessage{{Role: "tool", Content: json.RawMessage(`"x"`)}}},
		"arguments array": {Messages: []ChatMessage{{Role: "assistant", ToolCalls: []ChatToolCall{{Function: ChatFunctionCall{Name: "f", Arguments: json.RawMessage(`"[1]"`)}}}}}},
		"arguments num":   {Messages: []ChatMessage{{Role: "assistant", ToolCalls: []ChatToolCall{{Function: ChatFunctionCall{Name: "f", Arguments: json.RawMessage(`5`)}}}}}},
		"content":         {Messages: []ChatMessage{{Role: "user", Content: json.RawMessage(`{"a":1}`)}}},
		"part text":       {Messages: []ChatMessage{{Role: "user", Content: json.RawMessage(`[{"type":"text"}]`)}}},
		"tools":           {Tools: []json.RawMessage{json.RawMessage(`{`)}, Messages: []ChatMessage{{Role: "user"}}},
	} {
		if _, err := RenderChat(&c); !errors.Is(err, ErrChat) {
			t.Errorf("%s: got %v, want ErrChat", name, err)
		}
	}
}

func TestThinking(t *testing.T) {
	for in, want := range map[string]string{"": "max", "low": "low", "high": "high", "max": "max", "minimal": "low", "medium": "high", "xhigh": "max", "none": "off"} {
		on, effort, err := Thinking(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := map[bool]string{true: effort, false: "off"}[on]; got != want {
			t.Errorf("reasoning_effort %q: %s, want %s", in, got, want)
		}
	}
}

func TestPyFloatRepr(t *testing.T) {
	for f, want := range map[float64]string{1: "1.0", 0.1: "0.1", 1e-5: "1e-05", 1e-4: "0.0001", 1e16: "1e+16", 1e15: "1000000000000000.0",
		1234.5: "1234.5", -2.5e-7: "-2.5e-07", 123456789.12345679: "123456789.12345679", 2.5e20: "2.5e+20", 1.5e300: "1.5e+300"} {
		if got := pyFloatRepr(f); got != want {
			t.Errorf("%v: %s, want %s", f, got, want)
		}
	}
}

func TestParsePyJSON(t *testing.T) {
	for in, want := range map[string]string{
		`{"b":1,"a":[1.0,-0,1e2,"\u00e9\ud83d\ude00",null,true],"b":2}`: `{"b": 2, "a": [1.0, 0, 100.0, "é😀", null, true]}`,
		` [NaN, Infinity, -Infinity, 1e400] `:                           `[NaN, Infinity, -Infinity, Infinity]`,
		`"a\"\\\/\b\f\n\r\t\u0001"`:                                     `"a\"\\/\b\f\n\r\t\u0001"`,
	} {
		v, err := parsePyJSON(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := v.dump(dumpDefault); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	for _, bad := range []string{``, `{`, `[1,]`, `01`, `1.`, `{"a" 1}`, `"\x"`, "\"\x01\"", `[1] x`, strings.Repeat("[", 600) + strings.Repeat("]", 600)} {
		if _, err := parsePyJSON(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
