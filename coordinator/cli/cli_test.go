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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tandem-inference/tandem/configs"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/internal/syncbuf"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

type syncBuffer = syncbuf.Buffer

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

// privateConfigDir points the user config directory at a temporary one,
// so that the identities the embedded server creates on first start stay
// in the test, and returns where they will be.
func privateConfigDir(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	t.Setenv("AppData", filepath.Join(home, "AppData"))
	dir, err := cp.DefaultCredentialsDir()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dir, home) {
		t.Fatalf("the credentials directory %s is outside the test's home %s", dir, home)
	}
	return dir
}

// TestServeAndClientCommands: `coordinator serve` with its embedded NATS
// server creates this machine's identities on first start (0600 files in
// the user config directory) and admits only them; workers join with the
// worker identity; submit, jobs, cancel and workers find theirs without a
// flag; submit streams a job's tokens and prints its timing; jobs, workers
// and cancel report; /metrics counts the job.
func TestServeAndClientCommands(t *testing.T) {
	creds := privateConfigDir(t)
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
			"--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--registry-ttl", "2s", "--timeouts-shutdown-grace", "2s", "--log-format", "json"})
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
	metricsURL := logged(t, serveLog, "metrics and health", "url")
	if got := logged(t, serveLog, "embedded NATS server credentials", "dir"); got != creds {
		t.Fatalf("credentials in %s, want %s", got, creds)
	}
	if st, err := os.Stat(creds); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("credentials directory: %v, %v; want mode 0700", st, err)
	}
	var ids []cp.Identity
	for _, p := range []cp.Principal{cp.PrincipalCoordinator, cp.PrincipalWorker, cp.PrincipalClient} {
		f := cp.IdentityFile(creds, p)
		st, err := os.Stat(f)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v; want mode 0600", f, st, err)
		}
		id, err := cp.LoadIdentity(f)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, *id)
	}
	if nc, err := cp.Connect(ctx, cp.Options{URL: url}); err == nil {
		nc.Close()
		t.Fatal("the embedded server admitted a connection without credentials")
	}
	apiURL := logged(t, serveLog, "OpenAI-compatible API", "url")

	// Workers join the coordinator's NATS, as other machines would.
	// Once the coordinator serves, its job queue and worker registry exist.
	logged(t, serveLog, "coordinator serving", "model")
	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, NATSURL: url, NoCoordinator: true, Threads: 1,
		Registry: cp.RegistryConfig{TTL: 2 * time.Second}, Identities: ids})
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
	// Each worker's model identity: the config and the tensors of dir.
	modelID, err := modelinfo.Identity(dir)
	if err != nil || !modelinfo.HasTensors(modelID) {
		t.Fatalf("identity %q: %v", modelID, err)
	}
	if n := strings.Count(out, modelID); n != 3 {
		t.Errorf("workers shows model %s %d times, want once per worker:\n%s", modelID, n, out)
	}
	for _, want := range []string{"prefill-0", "local-r0", "local-r1", "local r1/2", "[0,5)"} {
		if !strings.Contains(out, want) {
			t.Errorf("workers does not list %q:\n%s", want, out)
		}
	}
	// One garbage entry in the registry (anyone who may write to the
	// bucket can put one) is skipped with a warning; the workers are listed.
	if err := putRegistryEntry(ctx, url, cp.Find(ids, cp.PrincipalWorker), "garbage-entry", []byte("not a heartbeat")); err != nil {
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
		"tandem_coordinator_ttft_seconds_count", "tandem_coordinator_submit_to_assign_seconds_count 1", `tandem_coordinator_workers{kind="decode"} 2`,
		`tandem_coordinator_tokens_total{kind="prompt"} 4`, `tandem_coordinator_tokens_total{kind="output"} 6`,
		`tandem_coordinator_job_mean_inter_token_seconds_count{target="remote"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	base := strings.TrimSuffix(metricsURL, "/metrics")
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != want {
			t.Errorf("%s: %d %q, want 200 %q", path, resp.StatusCode, body, want)
		}
	}

	// The OpenAI-compatible API that serve runs, and the same API alone
	// (coordinator api) on the deployment's NATS.
	apiCtx, stopAPI := context.WithCancel(ctx)
	apiLog := &syncBuffer{}
	apiDone := make(chan error, 1)
	go func() {
		root := New(io.Discard, apiLog)
		root.SetArgs(append([]string{"api", "--model", dir, "--http-listen", "127.0.0.1:0", "--log-format", "json"}, nats...))
		apiDone <- root.ExecuteContext(apiCtx)
	}()
	aloneURL := logged(t, apiLog, "OpenAI-compatible API", "url")
	for _, base := range []string{apiURL, aloneURL} {
		var got struct {
			Object  string `json:"object"`
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		// The front door learns of the workers from the registry: it
		// answers 503 until it has.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			resp, err := http.Post(base+"/completions", "application/json", strings.NewReader(
				`{"model": "`+filepath.Base(dir)+`", "prompt": [5, 17, 200, 31], "max_tokens": 3, "temperature": 0}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && time.Now().Before(deadline) {
				continue
			}
			if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &got) != nil {
				t.Fatalf("%s: %d %s", base, resp.StatusCode, b)
			}
			break
		}
		if got.Object != "text_completion" || len(got.Choices) != 1 || got.Choices[0].FinishReason != "length" ||
			got.Usage.PromptTokens != 4 || got.Usage.CompletionTokens != 3 {
			t.Errorf("%s: %+v", base, got)
		}
	}
	stopAPI()
	if err := <-apiDone; err != nil {
		t.Errorf("api: %v\n%s", err, apiLog.String())
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
	t.Setenv("TANDEM_COORDINATOR_TIMEOUTS_ASSIGN", "3s")
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
	if cfg.Policy != cp.PolicyRemote || cfg.SeedPrefillTokPerS != 800 || cfg.MaxPromptTokens != 4096 ||
		cfg.AssignTimeout != 3*time.Second || cfg.DefaultMaxTokens != 99 || cfg.Registry.TTL != 10*time.Second {
		t.Fatalf("resolved %+v", cfg)
	}

	if err := os.WriteFile(file, []byte("router:\n  polcy: remote\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := resolve(cmd, natsSettings, serveSettings); err == nil || !strings.Contains(err.Error(), `unknown key "router.polcy" (did you mean router.policy?)`) || !strings.Contains(err.Error(), file) {
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
	for size, want := range map[string]string{"8 MiB": "", "8M": "KiB MiB GiB TiB", "lots": "KiB MiB GiB TiB", "65MiB": "at most 64 MiB"} {
		if err := os.WriteFile(file, []byte("embedded:\n  max_payload: "+size+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// A size outside the grammar is refused as the settings load, one
		// beyond the server's limit when its configuration is made.
		v, err := resolve(cmd, natsSettings, serveSettings)
		if err == nil {
			_, _, err = serverConfig(v, nil)
		}
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), "embedded.max_payload") || !strings.Contains(err.Error(), want)) {
			t.Errorf("max_payload %q: %v, want %q", size, err, want)
		}
	}
}

// TestHelpExplains: every command has help naming its settings.
func TestHelpExplains(t *testing.T) {
	for _, c := range []string{"serve", "submit", "jobs", "workers", "cancel", "demo", "credentials"} {
		out, _, err := run(context.Background(), c, "--help")
		if err != nil || len(out) < 200 {
			t.Errorf("%s --help: %v\n%s", c, err, out)
		}
	}
	for _, c := range [][]string{{"cache"}, {"cache", "list"}, {"cache", "drop"}} {
		out, _, err := run(context.Background(), append(c, "--help")...)
		if err != nil || !strings.Contains(out, "coordinator cache drop --all WORKER") || !strings.Contains(out, "TANDEM_COORDINATOR_NATS_URL") {
			t.Errorf("%s --help: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	out, _, _ := run(context.Background(), "serve", "--help")
	for _, want := range []string{"--nats-url", "--router-policy", "--registry-ttl", "--metrics-listen", "TANDEM_COORDINATOR_NATS_URL", "KiB MiB GiB TiB"} {
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
		if _, _, err := serverConfig(v, nil); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cfg.SeedPrefillTokPerS <= 0 || cfg.SeedLocalTokPerS <= 0 || cfg.Registry.TTL != 10*time.Second {
			t.Fatalf("%s: %+v", name, cfg)
		}
	}
}

// putRegistryEntry writes value under key in the worker registry bucket, as
// any worker (the identity allowed to write there) could.
func putRegistryEntry(ctx context.Context, url string, id *cp.Identity, key string, value []byte) error {
	nc, err := cp.Connect(ctx, cp.Options{URL: url, Identity: id})
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

// TestServeBeyondLoopback: `serve` on a non-loopback address refuses to
// start without credentials, saying what to do; with --insecure it starts
// and warns; with embedded.credentials_dir it creates the identities there
// and admits only them.
func TestServeBeyondLoopback(t *testing.T) {
	privateConfigDir(t)
	dir := testmodel.Dir(t, "tiny", 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := []string{"serve", "--model", dir, "--embedded-host", "0.0.0.0", "--embedded-port", "0", "--metrics-listen", "", "--http-listen", "127.0.0.1:0",
		"--log-format", "json"}
	start := time.Now()
	_, _, err := run(ctx, append(base, "--embedded-data-dir", t.TempDir())...)
	if err == nil || !strings.Contains(err.Error(), "beyond loopback") || !strings.Contains(err.Error(), "--insecure") ||
		!strings.Contains(err.Error(), "embedded.credentials_dir") {
		t.Fatalf("serve on 0.0.0.0 without credentials: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the refusal took %v", d)
	}

	creds := filepath.Join(t.TempDir(), "creds")
	for _, tc := range []struct {
		name  string
		extra []string
		log   string
	}{
		{"insecure", []string{"--insecure"}, "INSECURE"},
		{"credentials", []string{"--embedded-credentials-dir", creds}, "embedded NATS server credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serveCtx, stop := context.WithCancel(ctx)
			log := &syncBuffer{}
			done := make(chan error, 1)
			go func() {
				root := New(io.Discard, log)
				root.SetArgs(append(append(base, "--embedded-data-dir", t.TempDir()), tc.extra...))
				done <- root.ExecuteContext(serveCtx)
			}()
			url := logged(t, log, "embedded NATS server", "url")
			logged(t, log, "coordinator serving", "model")
			if !strings.Contains(log.String(), tc.log) {
				t.Errorf("the log does not say %q:\n%s", tc.log, log.String())
			}
			nc, err := cp.Connect(ctx, cp.Options{URL: url, ConnectTimeout: 2 * time.Second})
			if tc.name == "insecure" {
				if err != nil {
					t.Errorf("--insecure refused a connection without credentials: %v", err)
				} else {
					nc.Close()
				}
			} else {
				if err == nil {
					nc.Close()
					t.Error("admitted a connection without credentials")
				}
				id, err := cp.LoadIdentity(cp.IdentityFile(creds, cp.PrincipalClient))
				if err != nil {
					t.Fatal(err)
				}
				nc, err := cp.Connect(ctx, cp.Options{URL: url, Identity: id})
				if err != nil {
					t.Fatalf("the client identity in %s: %v", creds, err)
				}
				nc.Close()
			}
			stop()
			if err := <-done; err != nil {
				t.Fatalf("serve: %v\n%s", err, log.String())
			}
		})
	}
}

// TestCredentialsCommand: `coordinator credentials` creates the identities
// (0600 files), adds a client and a worker, keeps what exists, and writes a
// nats-server authorization block that holds no password.
func TestCredentialsCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	conf := filepath.Join(t.TempDir(), "auth.conf")
	out, errw, err := run(context.Background(), "credentials", "--dir", dir, "--add-client", "alice", "--add-worker", "gpu-0", "--nats-server-conf", conf)
	if err != nil {
		t.Fatalf("credentials: %v\n%s", err, errw)
	}
	for _, want := range []string{"added client alice", "added worker gpu-0", "tandem-coordinator", "tandem-worker", "tandem-client-local", "tandem-client-alice", "tandem-worker-gpu-0"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	ids, err := cp.EnsureCredentials(dir)
	if err != nil || len(ids) != 5 {
		t.Fatalf("identities: %d, %v", len(ids), err)
	}
	block, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(conf); st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v", conf, st.Mode().Perm())
	}
	if !strings.Contains(string(block), "authorization") || strings.Count(string(block), `"$2a$`) != 5 {
		t.Errorf("authorization block without five bcrypt hashes:\n%s", block)
	}
	for _, id := range ids {
		if strings.Contains(string(block), id.Password) {
			t.Errorf("the block holds %s's password", id.User)
		}
	}
	// A second run keeps every identity.
	if _, _, err := run(context.Background(), "credentials", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	again, err := cp.EnsureCredentials(dir)
	if err != nil || len(again) != 5 || again[0] != ids[0] || again[3] != ids[3] {
		t.Fatalf("after a second run: %v, %v", again, err)
	}
	if _, _, err := run(context.Background(), "credentials", "--dir", dir, "--add-client", "alice"); err == nil {
		t.Fatal("a client added twice")
	}
}

// TestAPIRefusesOpenListen: serve and api refuse, before starting
// anything, to serve the HTTP API beyond loopback without API keys.
func TestAPIRefusesOpenListen(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--model", t.TempDir(), "--http-listen", "0.0.0.0:8000"},
		{"api", "--model", t.TempDir(), "--http-listen", ":8000"},
	} {
		_, _, err := run(context.Background(), args...)
		if err == nil || !strings.Contains(err.Error(), "http.api_keys") {
			t.Errorf("%v: %v, want a refusal naming http.api_keys", args, err)
		}
	}
	if out, _, err := run(context.Background(), "api", "--help"); err != nil || !strings.Contains(out, "--http-api-keys") {
		t.Errorf("api --help: %v\n%s", err, out)
	}
}
