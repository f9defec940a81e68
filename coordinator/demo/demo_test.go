package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// TestDemo runs the demo end to end (the synthetic model is generated into
// a fresh cache) with shorter prompts and outputs, and checks its story.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	err := Run(ctx, Options{CacheDir: t.TempDir(), MaxTokens: 8, LongTokens: 400, Log: zaptest.NewLogger(t)}, &out)
	t.Logf("demo output (%v):\n%s", time.Since(start).Round(time.Millisecond), out.String())
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		"== short prompt", "== long prompt", "routed local", "predicted time to first token: local",
		"time to first token", "prefill (remote)", "transfer tail", "demo finished",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the demo does not say %q", want)
		}
	}
	if strings.Count(s, "text: ") < 2 {
		t.Errorf("fewer than two jobs streamed text")
	}
}
