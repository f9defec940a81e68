package demo

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/tandem-inference/tandem/internal/syncbuf"
)

type syncBuffer = syncbuf.Buffer

// TestDemo runs the demo end to end (the synthetic model is generated into
// a fresh cache) with shorter prompts and outputs, and checks its story;
// then the curl line it prints streams a chat completion from the API it
// keeps serving.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := &syncBuffer{}
	start := time.Now()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(runCtx, Options{CacheDir: t.TempDir(), MaxTokens: 8, LongTokens: 400, HTTPListen: "127.0.0.1:0", Stay: true,
			Log: zaptest.NewLogger(t)}, out)
	}()
	var curl string
	for curl == "" {
		select {
		case err := <-done:
			stop()
			t.Fatalf("the demo ended before serving the API: %v\n%s", err, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if l := strings.TrimSpace(line); strings.HasPrefix(l, "curl -N ") {
				curl = l
			}
		}
	}
	s := out.String()
	t.Logf("demo output (%v):\n%s", time.Since(start).Round(time.Millisecond), s)
	for _, want := range []string{
		"== short prompt", "== long prompt", "routed local", "predicted time to first token: local",
		"time to first token", "prefill (remote)", "transfer tail", "demo finished", "OpenAI-compatible API at http://127.0.0.1:",
		"prefill worker: kda ", "decode group's own prefill: kda ", "predicted against measured time to first token",
		"same 8 tokens both ways", "for the long prompt: measured",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the demo does not say %q", want)
		}
	}
	if strings.Count(s, "text: ") < 3 {
		t.Errorf("fewer than three jobs streamed text (short, long, long the other way)")
	}
	// Every job shows its predicted and measured TTFT, and the long
	// prompt ran both ways.
	if n := strings.Count(s, "time to first token: predicted "); n != 3 {
		t.Errorf("%d jobs show predicted against measured TTFT, want 3", n)
	}
	if !strings.Contains(s, "long prompt again, policy remote") && !strings.Contains(s, "long prompt again, policy local") {
		t.Errorf("the long prompt did not run the other way")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Logf("curl not installed (scripts/setup.sh installs it): the printed line is not run")
	} else {
		b, err := exec.CommandContext(ctx, "sh", "-c", curl).CombinedOutput()
		if err != nil || !strings.Contains(string(b), `"role":"assistant"`) || !strings.Contains(string(b), "data: [DONE]") {
			t.Errorf("%s: %v\n%s", curl, err, b)
		}
	}
	sdk(ctx, t, s)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// sdk runs the official openai package's check of K3's conversation format
// (coordinator/openai/testdata/client/chat.mjs) against the API the demo
// serves, as its output names it.
func sdk(ctx context.Context, t *testing.T, out string) {
	t.Helper()
	if testing.Short() {
		return // the node client; the race run covers the same handlers with Go clients
	}
	dir := filepath.Join("..", "openai", "testdata", "client")
	node, err := exec.LookPath("node")
	if _, serr := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil || serr != nil {
		t.Logf("node or the npm openai package missing (scripts/setup.sh installs them): the SDK check is not run")
		return
	}
	m := regexp.MustCompile(`OpenAI-compatible API at (http://\S+/v1) \(model "([^"]+)"\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the demo does not name its API and model:\n%s", out)
	}
	cmd := exec.CommandContext(ctx, node, "chat.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TANDEM_URL="+m[1], "TANDEM_MODEL="+m[2])
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node chat.mjs against the demo's API: %v\n%s", err, b)
	}
	t.Logf("the SDK saw: %s", b)
}
