package service_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// TestToolTurnsOverNATS: a chat with declared tools, an assistant turn that
// called one and the tool turn that answers it is framed by the chat
// template exactly as the HTTP front door frames it (tokenizer.EncodeChat
// with the tools), and runs; a tool turn that names no call, or a call on
// a user turn, is refused naming the field.
func TestToolTurnsOverNATS(t *testing.T) {
	opt := testOptions(t)
	opt.ModelDir = testmodel.Dir(t, "demo", 1, 2)
	c := startCluster(t, opt)
	nc := connect(t, c)
	const tools = `[{"name":"get_weather","description":"the weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]`
	req := cp.SubmitRequest{Tools: tools, Sampling: cp.Sampling{MaxTokens: 4}, Messages: []cp.ChatMessage{
		{Role: "system", Content: "Answer briefly."},
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []cp.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", ToolCallID: "call_1", Content: `{"temp_c": 21}`},
	}}
	res := run(t, nc, req)
	if res.Final.State != cp.StateDone {
		t.Fatalf("tool chat: %+v", res.Final)
	}
	call := tokenizer.Text("assistant", "")
	call.ToolCalls = []tokenizer.ChatToolCall{{ID: "call_1", Function: tokenizer.ChatFunctionCall{Name: "get_weather", Arguments: json.RawMessage(`"{\"city\":\"Paris\"}"`)}}}
	result := tokenizer.Text("tool", `{"temp_c": 21}`)
	result.ToolCallID = "call_1"
	want, err := c.Tokenizer.EncodeChat(&tokenizer.Chat{
		Tools:    []json.RawMessage{json.RawMessage(`{"type":"function","function":{"name":"get_weather","description":"the weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`)},
		Messages: []tokenizer.ChatMessage{tokenizer.Text("system", "Answer briefly."), tokenizer.Text("user", "Weather in Paris?"), call, result},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Final.Timing.PromptTokens; got != len(want) {
		t.Fatalf("prompt of %d tokens, the chat template makes %d", got, len(want))
	}
	// Without the tools and the call, the prompt is another one.
	plain, _ := c.Tokenizer.EncodeChat(&tokenizer.Chat{Messages: []tokenizer.ChatMessage{tokenizer.Text("user", "Weather in Paris?")}})
	if len(plain) >= len(want) {
		t.Fatalf("the framed tool chat (%d tokens) is not longer than the bare question (%d)", len(want), len(plain))
	}

	// Refusals come from the coordinator, to a JSON body with no header,
	// in JSON.
	for _, tc := range []struct{ name, body, want string }{
		{"tool turn without its call", `{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]}`, "messages[1].tool_call_id"},
		{"call on a user turn", `{"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]}]}`, "messages[0].tool_calls"},
		{"call without a name", `{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "", "arguments": ""}]}]}`, "messages[1].tool_calls[0].name"},
		{"tools that are not an array", `{"messages": [{"role": "user", "content": "x"}], "tools": "{}"}`, "tools"},
		{"tools without messages", `{"prompt": "x", "tools": "[]"}`, "tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := nc.Request(cp.ClientSubmit(cp.DefaultClient), []byte(tc.body), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if ct := r.Header.Get(cp.HeaderContentType); ct != cp.ContentTypeJSON {
				t.Fatalf("reply Content-Type %q, want JSON", ct)
			}
			var rep cp.SubmitReply
			if err := cp.Unmarshal(cp.JSON, r.Data, &rep); err != nil {
				t.Fatalf("reply %q: %v", r.Data, err)
			}
			if rep.Code != cp.CodeBadRequest || !strings.Contains(rep.Error, tc.want) || rep.JobID != "" {
				t.Fatalf("reply %+v, want bad_request naming %s", rep, tc.want)
			}
		})
	}
}
