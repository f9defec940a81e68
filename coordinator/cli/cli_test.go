package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tandem-inference/tandem/configs"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// syncBuffer collects a command's log while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logged waits for a JSON log line with message msg and returns its field.
func logged(t *testing.T, log *syncBuffer, msg, field string) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, line := range strings.Split(log.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
				if v, ok := m[field].(string); ok {
					return v
				}
			}
		}
	}
	t.Fatalf("no %q in the log:\n%s", msg, log.String())
	return ""
}

// run runs the command line and returns its stdout, stderr and error.
func run(ctx context.Context, args ...string) (string, string, error) {
	var out, errw bytes.Buffer
	root := New(&out, &errw)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return out.String(), errw.String(), err
}

// TestServeAndClientCommands: `coordinator serve` with its embedded NATS
// server takes workers and jobs; submit streams a job's tokens and prints
// its timing; jobs, workers and cancel report; /metrics counts the job.
func TestServeAndClientCommands(t *testing.T) {
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serveCtx, stop := context.WithCancel(ctx)
	var serveErr error
	serveLog := &syncBuffer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		root := New(io.Discard, serveLog)
		root.SetArgs([]string{"serve", "--model", dir, "--embedded-port", "0", "--embedded-data-dir", t.TempDir(),
			"--metrics-listen", "127.0.0.1:0", "--registry-ttl", "2s", "--timeouts-shutdown-grace", "2s", "--log-format", "json"})
		serveErr = root.ExecuteContext(serveCtx)
	}()
	defer func() {
		stop()
		wg.Wait()
		if serveErr != nil {
			t.Errorf("serve: %v\n%s", serveErr, serveLog.String())
		}
	}()
	url := logged(t, serveLog, "embedded NATS server", "url")
	metricsURL := logged(t, serveLog, "metrics", "url")

	// Workers join the coordinator's NATS, as other machines would.
	var c *cluster.Cluster
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		c, err = cluster.Start(ctx, cluster.Options{ModelDir: dir, NATSURL: url, NoCoordinator: true, Threads: 1,
			Registry: cp.RegistryConfig{TTL: 2 * time.Second}})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("workers: %v", err)
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	nats := []string{"--nats-url", url}
	out, errw, err := run(ctx, append([]string{"submit", "--ids", "5,17,200,31", "--max-tokens", "6", "--policy", "remote"}, nats...)...)
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, errw)
	}
	if n := len(strings.Fields(out)); n != 6 {
		t.Fatalf("submit printed %d token ids, want 6: %q", n, out)
	}
	for _, want := range []string{"routed remote", "prefill worker prefill-0", "time to first token", "transfer tail", "done (length)"} {
		if !strings.Contains(errw, want) {
			t.Errorf("submit does not say %q:\n%s", want, errw)
		}
	}
	jobID := strings.Fields(errw[strings.Index(errw, "job "):])[1]

	out, _, err = run(ctx, append([]string{"jobs"}, nats...)...)
	if err != nil || !strings.Contains(out, jobID) || !strings.Contains(out, "done") || !strings.Contains(out, "remote (prefill-0)") {
		t.Fatalf("jobs: %v\n%s", err, out)
	}
	out, _, err = run(ctx, append([]string{"workers"}, nats...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"prefill-0", "local-r0", "local-r1", "local r1/2", "[0,5)"} {
		if !strings.Contains(out, want) {
			t.Errorf("workers does not list %q:\n%s", want, out)
		}
	}
	// One garbage entry in the registry (anyone who may write to the
	// bucket can put one) is skipped with a warning; the workers are listed.
	if err := putRegistryEntry(ctx, url, "garbage-entry", []byte("not a heartbeat")); err != nil {
		t.Fatal(err)
	}
	out, errw, err = run(ctx, append([]string{"workers"}, nats...)...)
	if err != nil {
		t.Fatalf("workers with a garbage registry entry: %v", err)
	}
	for _, want := range []string{"prefill-0", "local-r0", "local-r1"} {
		if !strings.Contains(out, want) {
			t.Errorf("with a garbage entry, workers does not list %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errw, `warning: worker registry: key "garbage-entry" is not a worker heartbeat`) || strings.Contains(out, "garbage") {
		t.Errorf("the garbage entry is not skipped with a warning:\n%s\n%s", out, errw)
	}
	if _, _, err = run(ctx, append([]string{"cancel", jobID}, nats...)...); err == nil || !strings.Contains(err.Error(), "done already") {
		t.Errorf("cancel of a finished job: %v", err)
	}
	if _, _, err = run(ctx, append([]string{"cancel", "j-nosuchjob"}, nats...)...); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Errorf("cancel of an unknown job: %v", err)
	}
	if _, _, err = run(ctx, append([]string{"submit", "hello"}, nats...)...); err == nil || !strings.Contains(err.Error(), "no tokenizer") {
		t.Errorf("text for a model without tokenizer: %v", err)
	}

	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`tandem_coordinator_jobs_total{state="done"} 1`, `tandem_coordinator_route_decisions_total{policy="remote",target="remote"} 1`,
		"tandem_coordinator_ttft_seconds_count", "tandem_coordinator_submit_to_assign_seconds_count 1", `tandem_coordinator_workers{kind="decode"} 2`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestConfigFileAndEnvironment: a config file's keys and the environment
// reach the settings; unknown keys and bad values are refused by name.
func TestConfigFileAndEnvironment(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("router:\n  policy: remote\n  prefill_tok_s: 800\nlimits:\n  max_prompt_tokens: 4096\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TANDEM_COORD_TIMEOUTS_ASSIGN", "3s")
	cmd := serveCmd()
	cmd.Flags().String("config", "", "")
	if err := cmd.ParseFlags([]string{"--config", file, "--limits-default-max-tokens", "99"}); err != nil {
		t.Fatal(err)
	}
	v, err := resolve(cmd, natsSettings, serveSettings)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := serviceConfig(v)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Policy != cp.PolicyRemote || cfg.Rates.PrefillTokPerS != 800 || cfg.MaxPromptTokens != 4096 ||
		cfg.AssignTimeout != 3*time.Second || cfg.DefaultMaxTokens != 99 || cfg.Registry.TTL != 10*time.Second {
		t.Fatalf("resolved %+v", cfg)
	}

	if err := os.WriteFile(file, []byte("router:\n  polcy: remote\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := resolve(cmd, natsSettings, serveSettings); err == nil || !strings.Contains(err.Error(), "router.polcy") {
		t.Fatalf("unknown key: %v", err)
	}
	if err := os.WriteFile(file, []byte("router:\n  policy: fastest\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err = resolve(cmd, natsSettings, serveSettings)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serviceConfig(v); err == nil || !strings.Contains(err.Error(), "router.policy") {
		t.Fatalf("bad policy: %v", err)
	}
	if _, err := parseBytes("embedded.max_payload", "8 MiB"); err != nil {
		t.Fatal(err)
	}
	if _, err := parseBytes("embedded.max_payload", "lots"); err == nil || !strings.Contains(err.Error(), "embedded.max_payload") {
		t.Fatalf("bad size: %v", err)
	}
}

// TestHelpExplains: every command has help naming its settings.
func TestHelpExplains(t *testing.T) {
	for _, c := range []string{"serve", "submit", "jobs", "workers", "cancel", "demo"} {
		out, _, err := run(context.Background(), c, "--help")
		if err != nil || len(out) < 200 {
			t.Errorf("%s --help: %v\n%s", c, err, out)
		}
	}
	out, _, _ := run(context.Background(), "serve", "--help")
	for _, want := range []string{"--nats-url", "--router-policy", "--registry-ttl", "--metrics-listen", "TANDEM_COORD"} {
		if !strings.Contains(out, want) && !strings.Contains(rootHelp, want) {
			t.Errorf("serve --help lacks %s", want)
		}
	}
}

// TestLayoutsLoad: the coordinator configurations in configs/ load with no
// unknown key and valid values.
func TestLayoutsLoad(t *testing.T) {
	for _, name := range []string{"local", "cluster"} {
		b, err := configs.Layout(name)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), name+".yaml")
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := serveCmd()
		cmd.Flags().String("config", "", "")
		if err := cmd.ParseFlags([]string{"--config", file}); err != nil {
			t.Fatal(err)
		}
		v, err := resolve(cmd, natsSettings, serveSettings)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cfg, err := serviceConfig(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := serverConfig(v, nil); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cfg.Rates.PrefillTokPerS <= 0 || cfg.Rates.LocalPrefillTokPerS <= 0 || cfg.Registry.TTL != 10*time.Second {
			t.Fatalf("%s: %+v", name, cfg)
		}
	}
}

// putRegistryEntry writes value under key in the worker registry bucket, as
// any client allowed to write there could.
func putRegistryEntry(ctx context.Context, url, key string, value []byte) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	kv, err := js.KeyValue(ctx, cp.WorkersBucket)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, key, value)
	return err
}
