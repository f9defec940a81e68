package cli

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/internal/testimage"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestSubmitChatFile: `submit --chat FILE.json` takes an OpenAI chat
// request body and prints the reply's thinking and response apart; with
// tool_choice "required" and a thinking budget the reply is a call of the
// declared tool, printed as NAME ARGUMENTS after the thinking; a body that
// is not a chat is refused naming the file.
func TestSubmitChatFile(t *testing.T) {
	privateConfigDir(t)
	dir := testmodel.Dir(t, "demo", 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, NoPrefill: true, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "client.json")
	if err := cp.SaveIdentity(creds, cp.Find(c.Identities(), cp.PrincipalClient)); err != nil {
		t.Fatal(err)
	}
	nats := []string{"--nats-url", c.URL, "--nats-credentials", creds}
	write := func(name string, body any) string {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}

	// Thinking is K3's default: the reply opens in the think channel.
	plain := write("plain.json", map[string]any{
		"messages":   []map[string]any{{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Why split prefill and decode?"}},
		"max_tokens": 6, "temperature": 0,
	})
	out, errw, err := run(ctx, append([]string{"submit", "--chat", plain}, nats...)...)
	if err != nil {
		t.Fatalf("submit --chat: %v\n%s", err, errw)
	}
	if !strings.HasPrefix(out, "thinking:\n") || len(out) == len("thinking:\n") {
		t.Errorf("the reply is not printed as thinking:\n%q", out)
	}

	// A required call after at most two tokens of thinking.
	tools := []map[string]any{{"type": "function", "function": map[string]any{"name": "get_weather", "description": "Current weather",
		"parameters": map[string]any{"type": "object", "additionalProperties": false, "required": []string{"city", "unit"},
			"properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 8}, "unit": map[string]any{"type": "string", "enum": []string{"c", "f"}}}}}}}
	call := write("call.json", map[string]any{
		"messages": []map[string]any{{"role": "user", "content": "Weather in Paris?"}}, "tools": tools, "tool_choice": "required",
		"thinking_budget": 2, "max_tokens": 400, "temperature": 1, "seed": 3,
	})
	out, errw, err = run(ctx, append([]string{"submit", "--chat", call}, nats...)...)
	if err != nil {
		t.Fatalf("submit --chat with a required call: %v\n%s", err, errw)
	}
	think, calls, ok := strings.Cut(out, "\ntool calls:\n")
	if !ok || !strings.HasPrefix(think, "thinking:\n") || !strings.HasPrefix(calls, "get_weather {") {
		t.Fatalf("want thinking, then the call:\n%s\n%s", out, errw)
	}
	var args struct {
		City string `json:"city"`
		Unit string `json:"unit"`
	}
	line, _, _ := strings.Cut(strings.TrimPrefix(calls, "get_weather "), "\n")
	if err := json.Unmarshal([]byte(line), &args); err != nil || (args.Unit != "c" && args.Unit != "f") || len([]rune(args.City)) > 8 {
		t.Errorf("the call's arguments %s do not hold to the schema: %v", line, err)
	}
	if !strings.Contains(errw, "done (tool_calls)") {
		t.Errorf("submit does not say the reply called a tool:\n%s", errw)
	}

	// An image with a plain prompt: one user message, the image first.
	png := filepath.Join(t.TempDir(), "square.png")
	if err := os.WriteFile(png, testimage.PNG(t, 56, 56, 4), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errw, err = run(ctx, append([]string{"submit", "--image", png, "--max-tokens", "3", "What is this?"}, nats...)...)
	if err != nil || !strings.Contains(errw, " done (") {
		t.Fatalf("submit --image: %v\n%s\n%s", err, out, errw)
	}
	notPNG := filepath.Join(t.TempDir(), "notes.png")
	if err := os.WriteFile(notPNG, []byte("not an image"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := run(ctx, append([]string{"submit", "--image", notPNG, "What is this?"}, nats...)...); err == nil ||
		!strings.Contains(err.Error(), "image #1") || !strings.Contains(err.Error(), "unrecognised image format") {
		t.Errorf("submit --image with a file that is not an image: %v", err)
	}

	notChat := write("bad.json", map[string]any{"prompt": "x"})
	if _, _, err := run(ctx, append([]string{"submit", "--chat", notChat}, nats...)...); err == nil || !strings.Contains(err.Error(), notChat) {
		t.Errorf("a body without messages: %v", err)
	}
}

// TestServeWithTheOpenAISDK: the official openai package drives the API
// that `coordinator serve` runs, in K3's conversation format
// (coordinator/openai/testdata/client/chat.mjs: thinking streamed as
// reasoning_content, required calls and strict JSON valid on three seeds).
func TestServeWithTheOpenAISDK(t *testing.T) {
	if testing.Short() {
		t.Skip("node client; -short (the race run covers the same handlers with Go clients)")
	}
	sdkDir := filepath.Join("..", "openai", "testdata", "client")
	node, err := exec.LookPath("node")
	if _, serr := os.Stat(filepath.Join(sdkDir, "node_modules", "openai", "package.json")); err != nil || serr != nil {
		t.Skip("node or the npm openai package missing (scripts/setup.sh installs them)")
	}
	creds := privateConfigDir(t)
	dir := testmodel.Dir(t, "demo", 1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	serveCtx, stop := context.WithCancel(ctx)
	serveLog := &syncBuffer{}
	served := make(chan error, 1)
	go func() {
		root := New(io.Discard, serveLog)
		root.SetArgs([]string{"serve", "--model", dir, "--embedded-port", "0", "--embedded-data-dir", t.TempDir(),
			"--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--log-format", "json"})
		served <- root.ExecuteContext(serveCtx)
	}()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v\n%s", err, serveLog.String())
		}
	}()
	url := logged(t, serveLog, "embedded NATS server", "url")
	apiURL := logged(t, serveLog, "OpenAI-compatible API", "url")
	logged(t, serveLog, "coordinator serving", "model")
	var ids []cp.Identity
	for _, p := range []cp.Principal{cp.PrincipalCoordinator, cp.PrincipalWorker, cp.PrincipalClient} {
		id, err := cp.LoadIdentity(cp.IdentityFile(creds, p))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, *id)
	}
	c, err := cluster.Start(ctx, cluster.Options{ModelDir: dir, NATSURL: url, NoCoordinator: true, NoPrefill: true, Threads: 1, Identities: ids})
	if err != nil {
		t.Fatalf("workers: %v", err)
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, node, "chat.mjs")
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "TANDEM_URL="+apiURL, "TANDEM_MODEL="+filepath.Base(dir))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node chat.mjs against serve's API: %v\n%s", err, out)
	}
	t.Logf("the SDK saw: %s", out)
}
