package tokenizer

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// byteRanks returns a rank file with the 256 single bytes and then extra.
func byteRanks(extra ...string) string {
	var sb strings.Builder
	for b := 0; b < 256; b++ {
		fmt.Fprintf(&sb, "%s %d\n", base64.StdEncoding.EncodeToString([]byte{byte(b)}), b)
	}
	for i, e := range extra {
		fmt.Fprintf(&sb, "%s %d\n", base64.StdEncoding.EncodeToString([]byte(e)), 256+i)
	}
	return sb.String()
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestParseRanksErrors(t *testing.T) {
	base := byteRanks()
	tests := []struct {
		name, model, want string
	}{
		{"empty", "", "no ranks"},
		{"blank lines only", "\n\n\r\n", "no ranks"},
		{"no space", base + "YWJj\n", `:257: want "base64 rank"`},
		{"two spaces", base + b64("ab") + " 256 7\n", `:257: want "base64 rank"`},
		{"bad base64", base + "!!!! 256\n", ":257: token \"!!!!\" is not base64"},
		{"bad rank", base + b64("ab") + " x\n", `:257: rank "x" is not a non-negative integer`},
		{"negative rank", base + b64("ab") + " -1\n", `:257: rank "-1"`},
		{"duplicate rank", base + b64("ab") + " 3\n" + b64("cd") + " 256\n", ":257: rank 3 is also on line 4"},
		{"gap", base + b64("ab") + " 258\n", ":257: rank 258 leaves a gap: 257 ranks must be 0..256"},
		{"duplicate token", base + b64("ab") + " 256\n" + b64("ab") + " 257\n", `:258: token "ab" (rank 257) is also rank 256 on line 257`},
		{"missing byte", strings.Replace(base, b64("\n")+" 10\n", b64("ab")+" 10\n", 1), "no rank for the single byte 0x0a"},
		{"empty token", base + "= 256\n", ":257: "},
	}
	for _, tt := range tests {
		_, err := parseRanks([]byte(tt.model), "m")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tt.name, err, tt.want)
		}
	}
}

func TestParseRanksAcceptsUnorderedAndCRLF(t *testing.T) {
	model := b64("ab") + " 256\r\n\r\n" + byteRanks()
	v, err := parseRanks([]byte(model), "m")
	if err != nil {
		t.Fatal(err)
	}
	if v.len() != 257 || string(v.bytes(256)) != "ab" || v.rank["ab"] != 256 {
		t.Errorf("got %d ranks, rank 256 = %q", v.len(), v.bytes(256))
	}
}

func TestParseSpecials(t *testing.T) {
	names, err := parseSpecials([]byte(`{"added_tokens_decoder": {"258": {"content": "[BOS]", "special": true}, "513": {"content": "[PAD]"}}}`), 258, "c")
	if err != nil {
		t.Fatal(err)
	}
	if names[0] != "[BOS]" || names[255] != "[PAD]" || names[1] != "<|reserved_token_259|>" {
		t.Errorf("names = %q ... %q", names[:2], names[255])
	}
	if _, err := parseSpecials([]byte(`{}`), 258, "c"); err != nil {
		t.Errorf("config without added_tokens_decoder: %v", err)
	}

	bad := []struct{ config, want string }{
		{`not json`, "c: invalid character"},
		{`{"added_tokens_decoder": []}`, "not an object"},
		{`{"added_tokens_decoder": {"257": {"content": "x"}}}`, `added token "x" has id 257 outside the special range 258..513`},
		{`{"added_tokens_decoder": {"514": {"content": "x"}}}`, "outside the special range"},
		{`{"added_tokens_decoder": {"abc": {"content": "x"}}}`, `key "abc" is not a token id`},
		{`{"added_tokens_decoder": {"260": {"content": ""}}}`, "added token 260 has no content"},
		{`{"added_tokens_decoder": {"260": {"content": "a"}, "260": {"content": "b"}}}`, `id 260 appears twice ("a" and "b")`},
		{`{"added_tokens_decoder": {"260": {"content": "a"}, "261": {"content": "a"}}}`, `"a" names both id 260 and id 261`},
		{`{"added_tokens_decoder": {"260": {"content": "<|reserved_token_261|>"}}}`, "names both id 260 and id 261"},
		{`{"added_tokens_decoder": {"260": {"content": 5}}}`, `added_tokens_decoder["260"]`},
	}
	for _, tt := range bad {
		_, err := parseSpecials([]byte(tt.config), 258, "c")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tt.config, err, tt.want)
		}
	}
}

func TestLoadErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), ModelFile) {
		t.Errorf("missing model: err = %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ModelFile), []byte(byteRanks()+"zz 256\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(dir)
	if want := filepath.Join(dir, ModelFile) + ":257:"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("bad model: err = %v, want it to contain %q", err, want)
	}
}
