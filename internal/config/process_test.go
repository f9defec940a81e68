package config_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/internal/testbin"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// grammar is what every byte-size error quotes.
var grammar = []string{"KiB MiB GiB TiB (powers of 1024)", "KB MB GB TB (powers of 1000)"}

// TestBinariesShareOneConfiguration runs the four built binaries: --help
// exits 0 and explains on every binary and subcommand; a typo'd key in
// each kind of file fails naming the key, the file and the nearest valid
// key; the environment overrides a file and a flag the environment; a bad
// byte size prints the grammar; a renamed flag still works and says so.
func TestBinariesShareOneConfiguration(t *testing.T) {
	if testing.Short() {
		t.Skip("builds four binaries")
	}
	bin := testbin.Build(t, "./bench", "./prefill-worker", "./decode-worker", "./coordinator")
	model := testmodel.Dir(t, "tiny", 1, 2)
	home := t.TempDir()
	dir := t.TempDir()
	file := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	type result struct {
		stdout, stderr string
		code           int
	}
	run := func(t *testing.T, env []string, name string, args ...string) result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, testbin.Path(bin, name), args...)
		// A home of its own: nothing reads or writes the user's identities.
		cmd.Env = append(os.Environ(), append([]string{"HOME=" + home, "XDG_CONFIG_HOME=" + home, "XDG_CACHE_HOME=" + home}, env...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		return result{out.String(), errOut.String(), code}
	}
	mustFail := func(t *testing.T, r result, want ...string) {
		t.Helper()
		if r.code == 0 {
			t.Errorf("exit 0, want a failure with %q\nstdout: %s\nstderr: %s", want, r.stdout, r.stderr)
			return
		}
		for _, w := range want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
			}
		}
	}

	t.Run("help", func(t *testing.T) {
		// subcommands lists a help text's commands: the indented first
		// words of the lines after heading.
		subcommands := func(help, heading string) []string {
			_, rest, _ := strings.Cut(help, heading)
			var out []string
			for _, m := range regexp.MustCompile(`(?m)^  ([a-z][a-z0-9-]*) `).FindAllStringSubmatch(rest, -1) {
				if m[1] != "help" && m[1] != "completion" {
					out = append(out, m[1])
				}
			}
			return out
		}
		cases := [][]string{{"prefill-worker"}, {"decode-worker"}, {"decode-worker", "rdma-probe"}, {"coordinator"}, {"bench"}}
		root := run(t, nil, "coordinator", "--help")
		coord := subcommands(root.stdout, "Available Commands:")
		if len(coord) < 8 {
			t.Fatalf("coordinator --help lists %v", coord)
		}
		for _, c := range coord {
			cases = append(cases, []string{"coordinator", c})
		}
		benchHelp := run(t, nil, "bench", "--help")
		sub := subcommands(benchHelp.stdout, "Commands:")
		if len(sub) < 13 {
			t.Fatalf("bench --help lists %v", sub)
		}
		for _, c := range sub {
			cases = append(cases, []string{"bench", c})
		}
		for _, c := range cases {
			r := run(t, nil, c[0], append(c[1:], "--help")...)
			if r.code != 0 || len(r.stdout) < 300 || !strings.Contains(r.stdout, "--") || !strings.Contains(r.stdout, "TANDEM_") {
				t.Errorf("%v --help: exit %d, %d bytes of help without flags or environment variables:\n%s\n%s", c, r.code, len(r.stdout), r.stdout, r.stderr)
			}
			if flat := strings.Join(strings.Fields(r.stdout), " "); !strings.Contains(flat, grammar[0]) || !strings.Contains(flat, grammar[1]) {
				t.Errorf("%v --help does not give the byte-size grammar", c)
			}
		}
		for name, prefix := range map[string]string{"prefill-worker": "TANDEM_PREFILL_WORKER_", "decode-worker": "TANDEM_DECODE_WORKER_",
			"coordinator": "TANDEM_COORDINATOR_", "bench": "TANDEM_BENCH_"} {
			if r := run(t, nil, name, "--help"); !strings.Contains(r.stdout, prefix) {
				t.Errorf("%s --help does not name %s", name, prefix)
			}
		}
	})

	t.Run("typo in each file kind", func(t *testing.T) {
		coord := file("coordinator.yaml", "router:\n  polcy: remote\n")
		mustFail(t, run(t, nil, "coordinator", "serve", "--config", coord, "--model", model),
			coord, `unknown key "router.polcy" (did you mean router.policy?)`)
		prefill := file("prefill.yaml", "memory_budgt: 1GiB\n")
		mustFail(t, run(t, nil, "prefill-worker", "--config", prefill, "--model", model, "--prompt", "1,2,3", "--dry-run"),
			prefill, `unknown key "memory_budgt" (did you mean memory_budget?)`)
		renamed := file("prefill-old.yaml", "mem_budget: 1GiB\n")
		mustFail(t, run(t, nil, "prefill-worker", "--config", renamed, "--model", model, "--prompt", "1,2,3", "--dry-run"),
			renamed, `key "mem_budget" was renamed "memory_budget"`)
		worker := file("decode.yaml", "max_bach: 8\n")
		group := file("group.yaml", "group: g\nsecret: 0123456789abcdef0123\nranks:\n  - endpoint: 127.0.0.1:1\n    memory_budgt: 1GiB\n")
		mustFail(t, run(t, nil, "decode-worker", "--config", worker, "--group-config", group, "--model", model),
			worker, `unknown key "max_bach" (did you mean max_batch?)`)
		mustFail(t, run(t, nil, "decode-worker", "--group-config", group, "--model", model),
			group, `ranks[0]: unknown key "memory_budgt" (did you mean memory_budget?)`)
		top := file("group-top.yaml", "group: g\nsecert: 0123456789abcdef0123\nranks:\n  - endpoint: 127.0.0.1:1\n")
		mustFail(t, run(t, nil, "decode-worker", "--group-config", top, "--model", model),
			top, `unknown key "secert" (did you mean secret?)`)
		profile := file("box.yaml", "link:\n  gb_per_s: 1\n  rtt_su: 50\n")
		mustFail(t, run(t, nil, "bench", "sim", "--link", profile),
			profile, `line 3: unknown key "rtt_su" (did you mean rtt_us?)`)
	})

	t.Run("environment over file, flag over environment", func(t *testing.T) {
		// The prefill worker's dry run prints its budget.
		budget := file("budget.yaml", "memory_budget: 64MiB\n")
		args := []string{"--config", budget, "--model", model, "--prompt", "1,2,3", "--dry-run"}
		for _, c := range []struct {
			env   []string
			flags []string
			want  string
		}{
			{nil, nil, "budget 64.0 MiB"},
			{[]string{"TANDEM_PREFILL_WORKER_MEMORY_BUDGET=96MiB"}, nil, "budget 96.0 MiB"},
			{[]string{"TANDEM_PREFILL_WORKER_MEMORY_BUDGET=96MiB"}, []string{"--memory-budget", "80MiB"}, "budget 80.0 MiB"},
		} {
			r := run(t, c.env, "prefill-worker", append(args, c.flags...)...)
			if r.code != 0 || !strings.Contains(r.stdout, c.want) {
				t.Errorf("prefill-worker %v with %v: exit %d, want %q:\n%s%s", c.flags, c.env, r.code, c.want, r.stdout, r.stderr)
			}
		}
		// The coordinator and the decode worker: a log format from the
		// file is overridden by a bad one from the environment (refused by
		// name), which a flag overrides in turn (the run then gets as far
		// as the missing model).
		logs := file("logs.yaml", "log:\n  format: json\n")
		for _, c := range []struct {
			name, env string
			args      []string
		}{
			{"coordinator", "TANDEM_COORDINATOR_LOG_FORMAT=xml", []string{"serve", "--config", logs, "--model", filepath.Join(dir, "nowhere")}},
			{"decode-worker", "TANDEM_DECODE_WORKER_LOG_FORMAT=xml", []string{"--config", logs, "--group-config", group(t, dir), "--model", filepath.Join(dir, "nowhere")}},
		} {
			mustFail(t, run(t, []string{c.env}, c.name, c.args...), `log.format "xml": want console or json`)
			r := run(t, []string{c.env}, c.name, append(c.args, "--log-format", "console")...)
			mustFail(t, r, "nowhere")
			if strings.Contains(r.stderr, "log.format") {
				t.Errorf("%s: the flag did not override the environment:\n%s", c.name, r.stderr)
			}
		}
		// bench: the environment fills a flag not given; a flag wins.
		out := filepath.Join(dir, "mk")
		mustFail(t, run(t, []string{"TANDEM_BENCH_MKMODEL_PRESET=huge"}, "bench", "mkmodel", "--out", out), "huge")
		if r := run(t, []string{"TANDEM_BENCH_MKMODEL_PRESET=huge"}, "bench", "mkmodel", "--out", out, "--preset", "tiny"); r.code != 0 {
			t.Errorf("bench mkmodel --preset tiny under TANDEM_BENCH_MKMODEL_PRESET=huge: exit %d\n%s", r.code, r.stderr)
		}
	})

	t.Run("bad byte size prints the grammar", func(t *testing.T) {
		for _, c := range [][]string{
			{"prefill-worker", "--model", model, "--prompt", "1,2,3", "--dry-run", "--memory-budget", "2G"},
			{"decode-worker", "--group-config", group(t, dir), "--model", model, "--memory-budget", "2G"},
			{"coordinator", "serve", "--model", model, "--embedded-max-payload", "8M"},
			{"coordinator", "api", "--model", model, "--http-max-body-bytes", "lots"},
			{"bench", "stream", "--model", model, "--memory-budget", "2G"},
			{"bench", "e2e", "--memory-budget", "1.5"},
		} {
			r := run(t, nil, c[0], c[1:]...)
			mustFail(t, r, grammar...)
		}
	})

	t.Run("renamed flag", func(t *testing.T) {
		r := run(t, nil, "prefill-worker", "--model", model, "--prompt", "1,2,3", "--dry-run", "--mem-budget", "72MiB")
		if r.code != 0 || !strings.Contains(r.stdout, "budget 72.0 MiB") || !strings.Contains(r.stderr, "--mem-budget has been deprecated, use --memory-budget instead") {
			t.Errorf("--mem-budget: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})
}

// group writes a valid one-rank group file into dir.
func group(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "good-group.yaml")
	if err := os.WriteFile(p, []byte("group: g\nsecret: 0123456789abcdef0123\nranks:\n  - endpoint: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
