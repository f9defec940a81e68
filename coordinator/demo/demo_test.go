package demo

import (
	"context"
	"os/exec"
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
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
