package openai_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/tokenizer"
)

const clientDir = "testdata/client"

// TestOpenAISDK: the official openai npm package (pinned in
// testdata/client, installed by scripts/setup.sh) drives the API: chat
// whole and streamed agree, a forced tool call streams as it is whole and
// its result goes back in, completions and the model list work, and the
// SDK raises each error with its status. Usage is checked here against
// the chat format's framing.
func TestOpenAISDK(t *testing.T) {
	d, stdout := runSDK(t, "check.mjs")
	type use struct {
		Prompt     int `json:"prompt_tokens"`
		Completion int `json:"completion_tokens"`
		Total      int `json:"total_tokens"`
	}
	var out struct {
		Whole struct {
			Content string `json:"content"`
			Finish  string `json:"finish"`
			Usage   use    `json:"usage"`
			Job     string `json:"job"`
		} `json:"whole"`
		Streamed struct {
			Content string `json:"content"`
			Finish  string `json:"finish"`
			Usage   use    `json:"usage"`
		} `json:"streamed"`
		Tool struct {
			ID                string `json:"id"`
			RoundPromptTokens int    `json:"roundPromptTokens"`
		} `json:"tool"`
		Errors map[string]struct {
			Status int    `json:"status"`
			Code   string `json:"code"`
			Cls    string `json:"cls"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(stdout, &out); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	t.Logf("the SDK saw: %s", stdout)
	prompt, err := d.c.Tokenizer.EncodeChat(&tokenizer.Chat{Messages: []tokenizer.ChatMessage{tokenizer.Text("system", "Be brief."),
		tokenizer.Text("user", "Why split prefill and decode?")}})
	if err != nil {
		t.Fatal(err)
	}
	w, s := out.Whole, out.Streamed
	if w.Usage.Prompt != len(prompt) || w.Usage.Completion < 1 || w.Usage.Total != w.Usage.Prompt+w.Usage.Completion || w.Job == "" {
		t.Errorf("whole: usage %+v (want %d prompt tokens), job %q", w.Usage, len(prompt), w.Job)
	}
	if s.Content != w.Content || s.Finish != w.Finish || s.Usage != w.Usage {
		t.Errorf("streamed %+v, whole %+v", s, w)
	}
	if !strings.HasPrefix(out.Tool.ID, "call_") || out.Tool.RoundPromptTokens <= len(prompt)/2 {
		t.Errorf("tool round: %+v", out.Tool)
	}
	for name, want := range map[string]struct {
		status int
		cls    string
	}{"badKey": {401, "AuthenticationError"}, "unknownModel": {404, "NotFoundError"}, "n2": {400, "BadRequestError"},
		"tooLong": {413, "APIError"}} {
		if got := out.Errors[name]; got.Status != want.status || got.Cls != want.cls || got.Code == "" {
			t.Errorf("%s: the SDK raised %+v, want %d %s", name, got, want.status, want.cls)
		}
	}
}

// runSDK starts a deployment and runs the node script (testdata/client)
// against it with the official openai package; it returns the deployment
// and what the script printed.
func runSDK(t *testing.T, script string) (*deployment, []byte) {
	t.Helper()
	if testing.Short() {
		t.Skip("node client; -short (the race run covers the same handlers with Go clients)")
	}
	if _, err := os.Stat(filepath.Join(clientDir, "node_modules", "openai", "package.json")); err != nil {
		t.Skipf("npm openai not installed (run %s/setup.sh): %v", clientDir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node not found: %v", err)
	}
	d := startDeployment(t, func(c *openai.Config) {
		c.APIKeys = []string{"sk-tandem-test"}
		c.MaxPromptTokens = 900
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = clientDir
	cmd.Env = append(os.Environ(), "TANDEM_URL="+d.url+"/v1", "TANDEM_MODEL="+modelName, "TANDEM_KEY=sk-tandem-test")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\n%s\n%s", script, err, stdout.String(), stderr.String())
	}
	return d, stdout.Bytes()
}

// TestOpenAISDKGrammar: through the official openai package, tool_choice
// "required" and a strict json_schema give valid calls and JSON on 20
// seeds each at temperature 1 from the synthetic model's random weights,
// and with thinking on a stream carries reasoning_content deltas within
// thinking_budget before the call (testdata/client/grammar.mjs checks the
// schemas; here, that every reply was seen).
func TestOpenAISDKGrammar(t *testing.T) {
	_, stdout := runSDK(t, "grammar.mjs")
	var out struct {
		Calls    [][]struct{ Name, Arguments string } `json:"calls"`
		JSON     []string                             `json:"json"`
		Thinking struct {
			ReasoningDeltas int `json:"reasoningDeltas"`
		} `json:"thinking"`
	}
	if err := json.Unmarshal(stdout, &out); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	t.Logf("the SDK saw: %s", stdout)
	if len(out.Calls) != 20 || len(out.JSON) != 20 || out.Thinking.ReasoningDeltas < 1 {
		t.Fatalf("%d call replies, %d JSON replies, %d reasoning deltas", len(out.Calls), len(out.JSON), out.Thinking.ReasoningDeltas)
	}
}

// TestCurlEventStream: curl -N sees the raw server-sent events: the
// headers, one "data: " line per event each followed by a blank line, the
// role first, a finish reason, and "data: [DONE]" last.
func TestCurlEventStream(t *testing.T) {
	if testing.Short() {
		t.Skip("curl; -short")
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skipf("curl not found (scripts/setup.sh installs it): %v", err)
	}
	d := startDeployment(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	line := openai.CurlLine(d.addr, modelName, "")
	b, err := exec.CommandContext(ctx, "sh", "-c", strings.Replace(line, "curl -N", curl+" -N -sS -D /dev/stderr", 1)).Output()
	var ee *exec.ExitError
	if err != nil {
		if errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", line, err, ee.Stderr)
		}
		t.Fatal(err)
	}
	raw := string(b)
	if !strings.HasSuffix(raw, "data: [DONE]\n\n") {
		t.Fatalf("the stream does not end with data: [DONE]:\n%s", raw)
	}
	events := strings.Split(strings.TrimSuffix(raw, "\n\n"), "\n\n")
	if len(events) < 3 {
		t.Fatalf("%d events:\n%s", len(events), raw)
	}
	finish := 0
	for i, ev := range events {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("event %d is not one data line: %q", i, ev)
		}
		if i == len(events)-1 {
			break
		}
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta        map[string]any `json:"delta"`
				FinishReason *string        `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil || ch.Object != "chat.completion.chunk" || len(ch.Choices) != 1 {
			t.Fatalf("event %d: %v %s", i, err, data)
		}
		if (i == 0) != (ch.Choices[0].Delta["role"] == "assistant") {
			t.Fatalf("event %d: the role is in the first event only: %s", i, data)
		}
		if ch.Choices[0].FinishReason != nil {
			finish++
		}
	}
	if finish != 1 {
		t.Fatalf("%d finish reasons:\n%s", finish, raw)
	}
}
