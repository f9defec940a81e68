package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tandem-inference/tandem/internal/testkit"
)

// The golden files under testdata/golden/expected were made by the npm
// tiktoken package (see testdata/golden/generate.cjs) from the synthetic
// tokenizers WriteSynthetic writes. Every test run compares against them;
// when testdata/golden/node_modules holds the package (setup.sh installs
// it), the generator also runs live and its output is compared too.

const goldenDir = "testdata/golden"

type goldenManifest struct {
	Models []struct {
		Name  string `json:"name"`
		Vocab int    `json:"vocab"`
	} `json:"models"`
	Cases []goldenCase `json:"cases"`
}

type goldenCase struct {
	Name    string          `json:"name"`
	File    string          `json:"file"`
	Parts   [][2]any        `json:"parts"`
	Allowed json.RawMessage `json:"allowed"`
	Split   bool            `json:"split"`
}

// text builds the case's input bytes.
func (c goldenCase) text(t *testing.T) string {
	if c.File != "" {
		b, err := os.ReadFile(filepath.Join(goldenDir, "cases", c.File))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var sb strings.Builder
	for _, p := range c.Parts {
		s, ok1 := p[0].(string)
		n, ok2 := p[1].(float64)
		if !ok1 || !ok2 {
			t.Fatalf("case %s: bad part %v", c.Name, p)
		}
		sb.WriteString(strings.Repeat(s, int(n)))
	}
	return sb.String()
}

// encode encodes the case's input as the generator did.
func (c goldenCase) encode(t *testing.T, tok *Tokenizer, text string) []int {
	if len(c.Allowed) == 0 {
		return tok.Encode(text)
	}
	var names []string
	if string(c.Allowed) != `"all"` {
		if err := json.Unmarshal(c.Allowed, &names); err != nil {
			t.Fatalf("case %s: allowed: %v", c.Name, err)
		}
	}
	ids, err := tok.EncodeWithSpecials(text, names...)
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	return ids
}

type goldenModel struct {
	Generator    string `json:"generator"`
	Model        string `json:"model"`
	Vocab        int    `json:"vocab"`
	ModelSHA256  string `json:"model_sha256"`
	ConfigSHA256 string `json:"config_sha256"`
	Cases        []struct {
		Name   string `json:"name"`
		Count  int    `json:"count"`
		SHA256 string `json:"sha256"`
		IDs    []int  `json:"ids"`
	} `json:"cases"`
}

type goldenSplit struct {
	Cases []struct {
		Name   string   `json:"name"`
		Pieces []string `json:"pieces"`
	} `json:"cases"`
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// goldenModels writes the manifest's synthetic tokenizers once per test
// binary and returns the directory holding one folder per model.
var goldenModels = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "tandem-golden-models-")
	if err != nil {
		return "", err
	}
	var m goldenManifest
	b, err := os.ReadFile(filepath.Join(goldenDir, "cases.json"))
	if err != nil {
		return "", err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	for _, md := range m.Models {
		if err := WriteSynthetic(filepath.Join(dir, md.Name), md.Vocab, nil); err != nil {
			return "", err
		}
	}
	return dir, nil
})

func TestMain(m *testing.M) {
	code := testkit.Isolated(m).Run()
	if dir, err := goldenModels(); err == nil && dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

func fileSHA256(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func idsSHA256(ids []int) string {
	var b []byte
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func TestGoldenPattern(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(goldenDir, "pattern.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != SplitPattern() {
		t.Errorf("testdata/golden/pattern.txt differs from SplitPattern()")
	}
}

// checkGolden compares the tokenizer with the golden files in dir.
func checkGolden(t *testing.T, dir string) {
	var man goldenManifest
	readJSON(t, filepath.Join(goldenDir, "cases.json"), &man)
	texts := make(map[string]string)
	cases := make(map[string]goldenCase)
	for _, c := range man.Cases {
		texts[c.Name] = c.text(t)
		cases[c.Name] = c
	}
	models, err := goldenModels()
	if err != nil {
		t.Fatal(err)
	}
	for _, md := range man.Models {
		t.Run(md.Name, func(t *testing.T) {
			var g goldenModel
			readJSON(t, filepath.Join(dir, md.Name+".json"), &g)
			mdir := filepath.Join(models, md.Name)
			if got := fileSHA256(t, filepath.Join(mdir, ModelFile)); got != g.ModelSHA256 {
				t.Fatalf("WriteSynthetic(%d) wrote a different tiktoken.model (sha256 %s) from the one the goldens were made with (%s): rerun %s/generate.sh",
					md.Vocab, got, g.ModelSHA256, goldenDir)
			}
			if got := fileSHA256(t, filepath.Join(mdir, ConfigFile)); got != g.ConfigSHA256 {
				t.Fatalf("WriteSynthetic(%d) wrote a different tokenizer_config.json: rerun %s/generate.sh", md.Vocab, goldenDir)
			}
			tok, err := Load(mdir)
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Cases) != len(man.Cases) {
				t.Fatalf("%d golden cases, manifest has %d: rerun generate.sh", len(g.Cases), len(man.Cases))
			}
			for _, gc := range g.Cases {
				c, ok := cases[gc.Name]
				if !ok {
					t.Errorf("golden case %q is not in cases.json", gc.Name)
					continue
				}
				got := c.encode(t, tok, texts[gc.Name])
				if gc.IDs != nil {
					if i := firstDiff(got, gc.IDs); i >= 0 {
						t.Errorf("case %s: ids differ from %s at %d: got %s, want %s", gc.Name, g.Generator, i,
							window(t, tok, got, i), window(t, tok, gc.IDs, i))
						continue
					}
				}
				if len(got) != gc.Count || idsSHA256(got) != gc.SHA256 {
					t.Errorf("case %s: got %d ids (sha256 %s), %s gave %d (%s)", gc.Name, len(got), idsSHA256(got), g.Generator, gc.Count, gc.SHA256)
				}
			}
		})
	}
	t.Run("split", func(t *testing.T) {
		var g goldenSplit
		readJSON(t, filepath.Join(dir, "split.json"), &g)
		for _, gc := range g.Cases {
			var got []string
			kimiCuts.cut(toValidString(texts[gc.Name]), func(p string) {
				splitPieces(p, func(piece string) { got = append(got, piece) })
			})
			n := min(len(got), len(gc.Pieces))
			for i := 0; i <= n; i++ {
				if i == n {
					if len(got) != len(gc.Pieces) {
						t.Errorf("case %s: %d pieces, reference %d", gc.Name, len(got), len(gc.Pieces))
					}
					break
				}
				if got[i] != gc.Pieces[i] {
					lo := max(0, i-3)
					t.Errorf("case %s: piece %d differs: got %q, reference %q (context: got %q, reference %q)",
						gc.Name, i, got[i], gc.Pieces[i], got[lo:min(i+3, len(got))], gc.Pieces[lo:min(i+3, len(gc.Pieces))])
					break
				}
			}
		}
	})
}

func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// window shows ids around i with their text, for a readable failure.
func window(t *testing.T, tok *Tokenizer, ids []int, i int) string {
	lo, hi := max(0, i-3), min(len(ids), i+4)
	var parts []string
	for _, id := range ids[lo:hi] {
		b, err := tok.Decode([]int{id})
		if err != nil {
			parts = append(parts, fmt.Sprintf("%d(?)", id))
			continue
		}
		parts = append(parts, fmt.Sprintf("%d%q", id, b))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func TestGolden(t *testing.T) {
	checkGolden(t, filepath.Join(goldenDir, "expected"))
}

// TestGoldenLive reruns the generator with the npm package when it is
// installed and compares with its fresh output.
func TestGoldenLive(t *testing.T) {
	if _, err := os.Stat(filepath.Join(goldenDir, "node_modules", "tiktoken", "package.json")); err != nil {
		t.Skipf("npm tiktoken not installed (run %s/setup.sh): %v", goldenDir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node not found: %v", err)
	}
	if testing.Short() {
		t.Skip("the live generator takes seconds; skipped in -short mode")
	}
	models, err := goldenModels()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(node, "generate.cjs", "--models", models, "--out", out)
	cmd.Dir = goldenDir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node generate.cjs: %v\n%s", err, b)
	}
	checkGolden(t, out)
}
