package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tandem-inference/tandem/tokenizer"
)

// TestTokenizeChatPrintsTheReleasedRendering: `bench tokenize --chat F
// --json` prints, for a conversation of the K3 goldens, the segments and
// ids the released renderer made.
func TestTokenizeChatPrintsTheReleasedRendering(t *testing.T) {
	dir := t.TempDir()
	if err := tokenizer.WriteSynthetic(filepath.Join(dir, "tok"), 163840, nil); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("..", "tokenizer", "testdata", "k3chat")
	var in struct {
		Cases []struct {
			Name    string          `json:"name"`
			Request json.RawMessage `json:"request"`
		} `json:"cases"`
	}
	var want struct {
		Cases []struct {
			Name     string              `json:"name"`
			Segments []tokenizer.Segment `json:"segments"`
			IDs      []int               `json:"ids"`
		} `json:"cases"`
	}
	for name, v := range map[string]any{"conversations.json": &in, "expected.json": &want} {
		b, err := os.ReadFile(filepath.Join(golden, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range in.Cases {
		if c.Name != "agent-history" && c.Name != "response-format-json-schema" {
			continue
		}
		file := filepath.Join(dir, c.Name+".json")
		if err := os.WriteFile(file, c.Request, 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := tokenizeChat(&out, filepath.Join(dir, "tok"), file, true); err != nil {
			t.Fatal(err)
		}
		var got struct {
			Text     string              `json:"text"`
			Segments []tokenizer.Segment `json:"segments"`
			IDs      []int               `json:"ids"`
		}
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		var text string
		for _, s := range want.Cases[i].Segments {
			text += s.Text
		}
		if got.Text != text || !reflect.DeepEqual(got.Segments, want.Cases[i].Segments) || !reflect.DeepEqual(got.IDs, want.Cases[i].IDs) {
			t.Errorf("%s: bench tokenize --chat differs from the released rendering", c.Name)
		}
	}
}
