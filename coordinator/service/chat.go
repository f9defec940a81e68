package service

import (
	"encoding/json"
	"fmt"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/tokenizer"
)

// ChatOf turns a submission's chat (messages, tools, tool_choice,
// response_format, reasoning_effort) into the OpenAI-shaped chat the K3
// renderer reads, so that NATS submissions and the HTTP API render alike.
func ChatOf(req *cp.SubmitRequest) (*tokenizer.Chat, error) {
	c := &tokenizer.Chat{ReasoningEffort: req.ReasoningEffort}
	for _, m := range req.Messages {
		content, err := contentOf(&m)
		if err != nil {
			return nil, err
		}
		tm := tokenizer.ChatMessage{Role: m.Role, Name: m.Name, Content: content, ReasoningContent: m.ReasoningContent,
			ToolCallID: m.ToolCallID, Tool: m.Tool}
		for _, tc := range m.ToolCalls {
			args, err := json.Marshal(tc.Arguments)
			if err != nil {
				return nil, err
			}
			tm.ToolCalls = append(tm.ToolCalls, tokenizer.ChatToolCall{ID: tc.ID, Type: "function",
				Function: tokenizer.ChatFunctionCall{Name: tc.Name, Arguments: args}})
		}
		c.Messages = append(c.Messages, tm)
	}
	if req.Tools != "" {
		var decls []json.RawMessage
		if err := json.Unmarshal([]byte(req.Tools), &decls); err != nil {
			return nil, fmt.Errorf("tools: %w", err)
		}
		for i, d := range decls {
			var probe struct {
				Type string `json:"type"`
				Name string `json:"name"`
			}
			if err := json.Unmarshal(d, &probe); err != nil {
				return nil, fmt.Errorf("tools[%d]: %w", i, err)
			}
			if probe.Type == "" && probe.Name != "" {
				// A bare function: declared as OpenAI's tool object.
				d = json.RawMessage(`{"type":"function","function":` + string(d) + `}`)
			}
			c.Tools = append(c.Tools, d)
		}
	}
	switch req.ToolChoice {
	case "":
	case "auto", "none", "required":
		c.ToolChoice, _ = json.Marshal(req.ToolChoice)
	default:
		c.ToolChoice, _ = json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": req.ToolChoice}})
	}
	if req.ResponseFormat != "" {
		c.ResponseFormat = json.RawMessage(req.ResponseFormat)
	}
	return c, nil
}

// contentOf is a turn's content as OpenAI writes it: a string, or its
// parts ({"type": "text", "text": ...} and {"type": "image"}).
func contentOf(m *cp.ChatMessage) (json.RawMessage, error) {
	if len(m.Parts) == 0 {
		return json.Marshal(m.Content)
	}
	type part struct {
		Type string  `json:"type"`
		Text *string `json:"text,omitempty"`
	}
	parts := make([]part, len(m.Parts))
	for i, p := range m.Parts {
		parts[i].Type = p.Type
		if p.Type == cp.PartText {
			parts[i].Text = &m.Parts[i].Text
		}
	}
	return json.Marshal(parts)
}
