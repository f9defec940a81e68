package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "12B": 12, "12 b": 12, " 8 MiB ": 8 << 20, "8mib": 8 << 20, "8MIB": 8 << 20,
		"1KiB": 1 << 10, "2GiB": 2 << 30, "1.5GiB": 3 << 29, "2TiB": 2 << 40, "1TiB": 1 << 40,
		"1KB": 1000, "8MB": 8e6, "64GB": 64e9, "1.5tb": 1.5e12, "0.5KiB": 512, "1.0005KB": 1000,
	} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "G", "2G", "8M", "1K", "TB", "-1", "-1GiB", "1.5", "1.5B", "1..5GiB", ".5GiB", "5.GiB",
		"1e9", "0x10", "lots", "12 parsecs", "1 GiB extra", "9999999999TiB", "9223372036854775808",
		strings.Repeat("9", 100) + "B"} {
		_, err := ParseBytes(in)
		if err == nil {
			t.Errorf("ParseBytes(%q) accepted", in)
			continue
		}
		if !strings.Contains(err.Error(), "KiB MiB GiB TiB") && !strings.Contains(err.Error(), "too large") {
			t.Errorf("ParseBytes(%q): %v; want the grammar in the error", in, err)
		}
	}
	if n, err := ParseBytes("9223372036854775807"); err != nil || n != 1<<63-1 {
		t.Errorf("the largest size: %d, %v", n, err)
	}
}

func TestNearest(t *testing.T) {
	known := []string{"memory_budget", "model", "nats.url", "nats.user", "log.level", "threads"}
	for key, want := range map[string]string{
		"memory_budgt": "memory_budget", "memroy_budget": "memory_budget", "mem_budget": "memory_budget",
		"nats.ulr": "nats.url", "modle": "model", "log.levle": "log.level", "thread": "threads",
		"colour": "", "x": "", "completely_else": "",
	} {
		if got := Nearest(key, known); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", key, got, want)
		}
	}
}

var testSettings = []Setting{
	{Key: "memory_budget", Default: "8GiB", Help: "budget", Old: "mem_budget", Bytes: true},
	{Key: "nats.url", Default: "", Help: "url"},
	{Key: "threads", Default: 0, Help: "threads"},
	{Key: "wait", Default: time.Second, Help: "wait"},
	{Key: "prompt", Default: []string{}, Help: "prompts", Repeat: true},
	{Key: "keys", Default: []string{}, Help: "keys"},
	{Key: "dry_run", Default: false, Help: "dry", Old: "dryrun"},
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, file string, args ...string) (map[string]any, error) {
	t.Helper()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	aliasNotices = &out
	defer func() { aliasNotices = os.Stderr }()
	AddFlags(fs, testSettings)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	v, err := Load(fs, "test-proc", file, testSettings)
	if err != nil {
		return nil, err
	}
	return map[string]any{"memory_budget": v.GetString("memory_budget"), "nats.url": v.GetString("nats.url"),
		"threads": v.GetInt("threads"), "wait": v.GetDuration("wait"), "prompt": v.GetStringSlice("prompt"),
		"keys": v.GetStringSlice("keys"), "dry_run": v.GetBool("dry_run"), "deprecation": out.String()}, nil
}

// TestPrecedence: a flag wins over the environment, the environment over
// the file, the file over the default; each layer alone shows through.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, "c.yaml", "memory_budget: 2GiB\nnats:\n  url: nats://file:4222\nthreads: 3\nwait: 5s\n")
	t.Setenv("TANDEM_TEST_PROC_MEMORY_BUDGET", "3GiB")
	t.Setenv("TANDEM_TEST_PROC_NATS_URL", "nats://env:4222")
	got, err := load(t, file, "--memory-budget", "4GiB")
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"memory_budget": "4GiB", "nats.url": "nats://env:4222", "threads": 3, "wait": 5 * time.Second} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
	got, err = load(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if got["memory_budget"] != "3GiB" || got["threads"] != 0 || got["wait"] != time.Second {
		t.Errorf("without a file: %v", got)
	}
	t.Setenv("TANDEM_TEST_PROC_MEMORY_BUDGET", "")
	if got, _ = load(t, ""); got["memory_budget"] != "8GiB" {
		t.Errorf("an empty variable is unset: memory_budget %v, want the default", got["memory_budget"])
	}
}

func TestDeprecatedAlias(t *testing.T) {
	got, err := load(t, "", "--mem-budget", "1GiB", "--dryrun")
	if err != nil {
		t.Fatal(err)
	}
	if got["memory_budget"] != "1GiB" || got["dry_run"] != true {
		t.Errorf("the old spellings: %v", got)
	}
	if d := got["deprecation"].(string); !strings.Contains(d, "--mem-budget has been deprecated, use --memory-budget instead") {
		t.Errorf("the notice names the new flag: %q", d)
	}
	// Both given: the later one wins, as with one flag given twice.
	if got, _ = load(t, "", "--mem-budget", "1GiB", "--memory-budget", "2GiB"); got["memory_budget"] != "2GiB" {
		t.Errorf("both spellings: %v", got["memory_budget"])
	}
	if got, _ = load(t, "", "--memory-budget", "2GiB", "--mem-budget", "1GiB"); got["memory_budget"] != "1GiB" {
		t.Errorf("both spellings, the old one last: %v", got["memory_budget"])
	}
	if _, err := load(t, "", "--dryrun=maybe"); err == nil || !strings.Contains(err.Error(), "dryrun") {
		t.Errorf("a bad value through an alias: %v", err)
	}
	// An alias still beats the environment: it is a flag.
	t.Setenv("TANDEM_TEST_PROC_MEMORY_BUDGET", "3GiB")
	if got, _ = load(t, "", "--mem-budget", "1GiB"); got["memory_budget"] != "1GiB" {
		t.Errorf("alias against the environment: %v", got["memory_budget"])
	}
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	AddFlags(fs, testSettings)
	var usage bytes.Buffer
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	if strings.Contains(usage.String(), "mem-budget") {
		t.Errorf("the alias is listed in the help:\n%s", usage.String())
	}
}

// TestByteSettings: a byte-size setting outside the grammar is refused at
// load, from any source, naming the key and quoting the grammar.
func TestByteSettings(t *testing.T) {
	file := writeFile(t, "c.yaml", "memory_budget: 2G\n")
	for _, c := range []struct {
		file string
		args []string
		env  string
	}{{"", []string{"--memory-budget", "8M"}, ""}, {file, nil, ""}, {"", nil, "lots"}} {
		t.Setenv("TANDEM_TEST_PROC_MEMORY_BUDGET", c.env)
		_, err := load(t, c.file, c.args...)
		if err == nil || !strings.Contains(err.Error(), "memory_budget (--memory-budget): ") || !strings.Contains(err.Error(), "KiB MiB GiB TiB") {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestListFlags(t *testing.T) {
	got, err := load(t, "", "--prompt", "1,2,3", "--prompt", "4", "--keys", "a,b")
	if err != nil {
		t.Fatal(err)
	}
	if p := got["prompt"].([]string); len(p) != 2 || p[0] != "1,2,3" {
		t.Errorf("repeatable: %q", p)
	}
	if k := got["keys"].([]string); len(k) != 2 || k[1] != "b" {
		t.Errorf("comma list: %q", k)
	}
}

func TestStrictFile(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"typo.yaml", "memory_budgt: 2GiB\n", `unknown key "memory_budgt" (did you mean memory_budget?)`},
		{"nested.yaml", "nats:\n  ulr: nats://x\n", `unknown key "nats.ulr" (did you mean nats.url?)`},
		{"parent.yaml", "nats: nats://x\n", `unknown key "nats" (valid keys: `},
		{"renamed.yaml", "mem_budget: 2GiB\n", `key "mem_budget" was renamed "memory_budget"`},
		{"far.json", `{"colour": "blue"}`, `unknown key "colour" (valid keys: dry_run, keys, memory_budget`},
		{"typo.toml", "thraeds = 2\n", `unknown key "thraeds" (did you mean threads?)`},
	} {
		file := writeFile(t, c.name, c.text)
		_, err := load(t, file)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: %v; want the file and %s", c.name, err, c.want)
		}
	}
	if _, err := load(t, filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("a missing file: %v", err)
	}
}

func TestParseArgs(t *testing.T) {
	newFS := func() (*pflag.FlagSet, *string, *int) {
		fs := pflag.NewFlagSet("stream", pflag.ContinueOnError)
		fs.Usage = func() { fs.Output().Write([]byte("usage: bench stream\n")) }
		return fs, fs.String("budget", "1GiB", "budget"), fs.Int("runs", 1, "runs")
	}
	var stdout, stderr bytes.Buffer
	fs, _, _ := newFS()
	if err := ParseArgs(fs, "bench_stream", []string{"--help"}, &stdout, &stderr); !errors.Is(err, pflag.ErrHelp) || stdout.String() != "usage: bench stream\n" {
		t.Errorf("--help: %v, stdout %q", err, stdout.String())
	}
	fs, budget, runs := newFS()
	t.Setenv("TANDEM_BENCH_STREAM_BUDGET", "2GiB")
	t.Setenv("TANDEM_BENCH_STREAM_RUNS", "5")
	if err := ParseArgs(fs, "bench_stream", []string{"--runs", "3"}, &stdout, &stderr); err != nil || *budget != "2GiB" || *runs != 3 {
		t.Errorf("env under flags: %v, budget %s, runs %d", err, *budget, *runs)
	}
	fs, _, _ = newFS()
	t.Setenv("TANDEM_BENCH_STREAM_RUNS", "many")
	if err := ParseArgs(fs, "bench_stream", nil, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "TANDEM_BENCH_STREAM_RUNS") {
		t.Errorf("a bad variable: %v", err)
	}
	fs, _, _ = newFS()
	stderr.Reset()
	if err := ParseArgs(fs, "bench_stream", []string{"--runz", "3"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "--help") || stderr.Len() != 0 {
		t.Errorf("an unknown flag: %v, stderr %q", err, stderr.String())
	}
}

// TestLoggerKeysOnce: a key given by a parent logger, a child and the call
// appears once, with the latest value, in both formats.
func TestLoggerKeysOnce(t *testing.T) {
	for _, format := range []string{"console", "json"} {
		var buf bytes.Buffer
		log, err := NewLogger("info", format, &buf)
		if err != nil {
			t.Fatal(err)
		}
		log.With(zap.String("job_id", "j1"), zap.Int("rank", 0)).With(zap.String("job_id", "j1")).
			Info("step", zap.String("job_id", "j2"), zap.Int("tokens", 3))
		log.Debug("hidden")
		line := buf.String()
		if strings.Count(line, "job_id") != 1 || !strings.Contains(line, "j2") || strings.Count(line, "\n") != 1 {
			t.Errorf("%s: %q", format, line)
		}
		if format == "console" && !strings.Contains(line, "INFO\tstep\t") {
			t.Errorf("console line: %q", line)
		}
	}
	if _, err := NewLogger("loud", "console", nil); err == nil || !strings.Contains(err.Error(), "log.level") {
		t.Errorf("bad level: %v", err)
	}
	if _, err := NewLogger("info", "xml", nil); err == nil || !strings.Contains(err.Error(), "console or json") {
		t.Errorf("bad format: %v", err)
	}
}

func TestEnvName(t *testing.T) {
	for _, c := range [][3]string{{"coordinator", "nats.url", "TANDEM_COORDINATOR_NATS_URL"},
		{"prefill-worker", "memory_budget", "TANDEM_PREFILL_WORKER_MEMORY_BUDGET"},
		{"decode-worker", "mesh.idle", "TANDEM_DECODE_WORKER_MESH_IDLE"}, {"bench_stream", "read-size", "TANDEM_BENCH_STREAM_READ_SIZE"}} {
		if got := EnvName(c[0], c[1]); got != c[2] {
			t.Errorf("EnvName(%q, %q) = %s, want %s", c[0], c[1], got, c[2])
		}
	}
}

// FuzzParseBytes: any text is refused with the grammar or read as a
// non-negative size; a size written back as plain bytes reads the same.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"8MiB", "1.5 GiB", "64gb", "0", "9223372036854775807", "2G", "-1", "1e9", ".5KiB", "1..2MB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBytes(s)
		if err != nil {
			if !strings.Contains(err.Error(), "KiB MiB GiB TiB") && !strings.Contains(err.Error(), "too large") {
				t.Fatalf("ParseBytes(%q): %v does not give the grammar", s, err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("ParseBytes(%q) = %d", s, n)
		}
		if m, err := ParseBytes(strconv.FormatInt(n, 10)); err != nil || m != n {
			t.Fatalf("ParseBytes(%q) = %d, but %d reads as %d, %v", s, n, n, m, err)
		}
	})
}
