package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/pflag"

	"github.com/tandem-inference/tandem/tokenizer"
)

func init() {
	register(command{
		name:  "tokenize",
		short: "encode or decode text with a Kimi tokenizer, or render a chat (--chat); --speed compares MB/s with npm tiktoken",
		run:   runTokenize,
	})
}

func runTokenize(ctx context.Context, args []string) error {
	fs := pflag.NewFlagSet("tokenize", pflag.ContinueOnError)
	dir := fs.String("tokenizer", "", "tokenizer `dir` holding tiktoken.model and tokenizer_config.json")
	file := fs.String("file", "", "input `file`: text to encode, or comma-separated ids with --decode")
	decode := fs.Bool("decode", false, "decode the ids in --file and print the text")
	speed := fs.Bool("speed", false, "measure encoding MB/s on a 1 MB mixed text (or --file), beside npm tiktoken")
	iters := fs.Int("iters", 5, "timed repetitions for --speed (the best counts)")
	minRatio := fs.Float64("min-ratio", 1.0, "--speed fails if ours/WASM MB/s is below this")
	nodeDir := fs.String("node-dir", filepath.Join("tokenizer", "testdata", "golden"), "`dir` with speed.cjs and node_modules/tiktoken for --speed")
	synth := fs.String("write-synthetic", "", "write a synthetic tokenizer (bundled corpus) into `dir` and exit")
	vocab := fs.Int("vocab", 163840, "vocabulary size for --write-synthetic and the default --speed tokenizer")
	chat := fs.String("chat", "", "render an OpenAI chat completions request body (`file.json`: messages, tools, tool_choice, response_format, reasoning_effort) in K3's conversation format and print the prompt, its segments and ids")
	asJSON := fs.Bool("json", false, `with --chat: print {"text", "segments": [{"text", "special"}], "ids"} as JSON`)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case *synth != "":
		return tokenizer.WriteSynthetic(*synth, *vocab, nil)
	case *speed:
		return tokenizeSpeed(ctx, *dir, *file, *vocab, *iters, *minRatio, *nodeDir)
	case *chat != "":
		return tokenizeChat(os.Stdout, *dir, *chat, *asJSON)
	}
	if *dir == "" || *file == "" {
		return errors.New("need --tokenizer DIR and --file F (or --speed, or --write-synthetic DIR)")
	}
	tok, err := tokenizer.Load(*dir)
	if err != nil {
		return err
	}
	in, err := os.ReadFile(*file)
	if err != nil {
		return err
	}
	if *decode {
		ids, err := parseIDs(in)
		if err != nil {
			return fmt.Errorf("%s: %w", *file, err)
		}
		text, err := tok.Decode(ids)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(text)
		return err
	}
	start := time.Now()
	ids := tok.Encode(string(in))
	took := time.Since(start)
	fmt.Fprintf(os.Stderr, "%d bytes -> %d tokens in %v (%.1f MB/s)\n", len(in), len(ids), took, float64(len(in))/1e6/took.Seconds())
	return writeIDs(os.Stdout, ids)
}

// tokenizeChat renders the chat request in file with K3's released
// conversation format and prints the prompt, its segments (as the renderer
// splits them: each encoded apart) and the ids.
func tokenizeChat(w io.Writer, dir, file string, asJSON bool) error {
	if dir == "" {
		return errors.New("--chat needs --tokenizer DIR")
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return err
	}
	in, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var c tokenizer.Chat
	if err := json.Unmarshal(in, &c); err != nil {
		return fmt.Errorf("%s: not an OpenAI chat request body: %w", file, err)
	}
	segs, err := tokenizer.RenderChat(&c)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	ids, err := tok.EncodeSegments(segs)
	if err != nil {
		return err
	}
	var text strings.Builder
	for _, s := range segs {
		text.WriteString(s.Text)
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		return enc.Encode(struct {
			Text     string              `json:"text"`
			Segments []tokenizer.Segment `json:"segments"`
			IDs      []int               `json:"ids"`
		}{text.String(), segs, ids})
	}
	fmt.Fprintf(w, "%s\n\n%d segments (* = special):\n", text.String(), len(segs))
	for _, s := range segs {
		mark := " "
		if s.Special {
			mark = "*"
		}
		fmt.Fprintf(w, "%s %s\n", mark, strconv.Quote(s.Text))
	}
	fmt.Fprintf(w, "\n%d ids:\n", len(ids))
	return writeIDs(w, ids)
}

// writeIDs prints ids comma-separated on one line.
func writeIDs(w io.Writer, ids []int) error {
	_, err := w.Write(append(appendIDs(make([]byte, 0, 7*len(ids)+1), ids), '\n'))
	return err
}

func appendIDs(b []byte, ids []int) []byte {
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return b
}

// parseIDs reads comma-separated ids; spaces and newlines around them are
// ignored.
func parseIDs(in []byte) ([]int, error) {
	s := strings.TrimSpace(string(in))
	if s == "" {
		return nil, nil
	}
	fields := strings.Split(s, ",")
	ids := make([]int, len(fields))
	for i, f := range fields {
		id, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("id %d: %q is not an integer", i, strings.TrimSpace(f))
		}
		ids[i] = id
	}
	return ids, nil
}

// mixedText builds n bytes of text from the bundled corpus: its paragraphs
// in a seeded random order with random numbers and identifiers between
// them, so that pieces repeat as in real text but not only.
func mixedText(n int) []byte {
	paras := strings.Split(string(tokenizer.DefaultCorpus()), "\n\n")
	rng := rand.New(rand.NewPCG(7, 11))
	var b bytes.Buffer
	for b.Len() < n {
		b.WriteString(paras[rng.IntN(len(paras))])
		fmt.Fprintf(&b, " %d id_%x %s\n\n", rng.IntN(1_000_000), rng.Uint64(), strconv.FormatFloat(rng.Float64()*1000, 'f', 3, 64))
	}
	out := b.Bytes()[:n]
	for len(out) > 0 && !utf8.Valid(out) { // do not end inside a character
		out = out[:len(out)-1]
	}
	return out
}

type wasmResult struct {
	MBPerS float64 `json:"mb_per_s"`
	BestS  float64 `json:"best_s"`
	Bytes  int     `json:"bytes"`
	Count  int     `json:"count"`
	SHA256 string  `json:"sha256"`
}

func tokenizeSpeed(ctx context.Context, dir, file string, vocab, iters int, minRatio float64, nodeDir string) error {
	if iters < 1 {
		return fmt.Errorf("--iters %d: need at least 1", iters)
	}
	tmp, err := os.MkdirTemp("", "tandem-tokenize-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if dir == "" {
		dir = filepath.Join(tmp, "tokenizer")
		if err := tokenizer.WriteSynthetic(dir, vocab, nil); err != nil {
			return err
		}
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return err
	}
	var text []byte
	if file != "" {
		if text, err = os.ReadFile(file); err != nil {
			return err
		}
	} else {
		text = mixedText(1 << 20)
	}
	textFile := filepath.Join(tmp, "text.txt")
	if err := os.WriteFile(textFile, text, 0o644); err != nil {
		return err
	}

	s := string(text)
	ids := tok.Encode(s) // warm-up: builds the class table
	best := time.Duration(1<<63 - 1)
	for range iters {
		if err := ctx.Err(); err != nil {
			return err
		}
		start := time.Now()
		ids = tok.Encode(s)
		best = min(best, time.Since(start))
	}
	ours := float64(len(text)) / 1e6 / best.Seconds()
	sum := idsHash(ids)
	fmt.Printf("text: %d bytes, %d tokens, vocabulary %d\n", len(text), len(ids), tok.VocabSize())
	fmt.Printf("go tokenizer:   %8.2f MB/s (best of %d: %v)\n", ours, iters, best)

	script := filepath.Join(nodeDir, "speed.cjs")
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "tiktoken")); err != nil {
		return fmt.Errorf("npm tiktoken not installed in %s (run %s): %w", nodeDir, filepath.Join(nodeDir, "setup.sh"), err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "node", script, "--model", dir, "--text", textFile, "--iters", strconv.Itoa(iters))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("node %s: %w", script, err)
	}
	var w wasmResult
	if err := json.Unmarshal(out, &w); err != nil {
		return fmt.Errorf("node %s printed %q: %w", script, out, err)
	}
	if w.Count != len(ids) || w.SHA256 != sum {
		return fmt.Errorf("token ids differ from npm tiktoken on the timed text: go %d ids (sha256 %s), wasm %d (sha256 %s)", len(ids), sum, w.Count, w.SHA256)
	}
	ratio := ours / w.MBPerS
	fmt.Printf("npm tiktoken:   %8.2f MB/s (best of %d: %.3fs; same ids)\n", w.MBPerS, iters, w.BestS)
	fmt.Printf("ratio go/wasm:  %8.2f (limit %.2f)\n", ratio, minRatio)
	if ratio < minRatio {
		return fmt.Errorf("go tokenizer is %.2fx the WASM tokenizer's speed, below the limit %.2f", ratio, minRatio)
	}
	return nil
}

// idsHash is the sha256 of the ids written comma-separated, as speed.cjs
// computes it.
func idsHash(ids []int) string {
	h := sha256.Sum256(appendIDs(nil, ids))
	return hex.EncodeToString(h[:])
}
