package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/tokenizer"
)

// chatBody is the part of an OpenAI chat completions request body that
// `submit --chat FILE.json` reads.
type chatBody struct {
	tokenizer.Chat
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Seed                *uint64         `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	ThinkingBudget      int             `json:"thinking_budget"`
}

// readChatFile reads an OpenAI chat request body (file, or "-" for in)
// into a submission: the messages, tools, tool_choice, response_format,
// reasoning_effort and sampling parameters it gives.
func readChatFile(file string, in io.Reader) (cp.SubmitRequest, error) {
	var req cp.SubmitRequest
	var b []byte
	var err error
	if file == "-" {
		b, err = io.ReadAll(io.LimitReader(in, cp.MaxPromptBytes+cp.MaxToolsBytes+1))
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return req, fmt.Errorf("--chat: %w", err)
	}
	var body chatBody
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&body); err != nil {
		return req, fmt.Errorf("--chat %s: not an OpenAI chat request body: %w", file, err)
	}
	if len(body.Messages) == 0 {
		return req, fmt.Errorf("--chat %s: no messages", file)
	}
	for i, m := range body.Messages {
		cm, imgs, err := chatMessage(m)
		if err != nil {
			return req, fmt.Errorf("--chat %s: messages[%d]: %w", file, i, err)
		}
		req.Messages = append(req.Messages, cm)
		req.Images = append(req.Images, imgs...)
	}
	if len(body.Tools) > 0 {
		tools, err := json.Marshal(body.Tools)
		if err != nil {
			return req, err
		}
		req.Tools = string(tools)
	}
	req.ToolChoice = body.ChatToolChoice()
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if req.ToolChoice == "" && json.Unmarshal(body.ToolChoice, &named) == nil {
		req.ToolChoice = named.Function.Name
	}
	if rf := bytes.TrimSpace(body.ResponseFormat); len(rf) > 0 && string(rf) != "null" {
		req.ResponseFormat = string(rf)
	}
	req.ReasoningEffort, req.ThinkingBudget = body.ReasoningEffort, body.ThinkingBudget
	switch {
	case body.MaxCompletionTokens != nil:
		req.MaxTokens = *body.MaxCompletionTokens
	case body.MaxTokens != nil:
		req.MaxTokens = *body.MaxTokens
	}
	if body.Temperature != nil {
		req.Temperature = *body.Temperature
	} else {
		req.Temperature = 1 // OpenAI's default
	}
	if body.TopP != nil {
		req.TopP = *body.TopP
	}
	if body.Seed != nil {
		req.Seed = *body.Seed
	}
	if s := bytes.TrimSpace(body.Stop); len(s) > 0 && string(s) != "null" {
		var one string
		if json.Unmarshal(s, &one) == nil {
			req.Stop.Texts = []string{one}
		} else if err := json.Unmarshal(s, &req.Stop.Texts); err != nil {
			return req, fmt.Errorf("--chat %s: stop must be a string or an array of strings", file)
		}
	}
	return req, nil
}

// chatMessage converts an OpenAI message to the control plane's; as the
// HTTP API does, a developer message is a system message.
func chatMessage(m tokenizer.ChatMessage) (cp.ChatMessage, [][]byte, error) {
	out := cp.ChatMessage{Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID, Tool: m.Tool, ReasoningContent: m.ReasoningContent}
	if out.Role == "developer" {
		out.Role = "system"
	}
	if out.ReasoningContent == "" {
		out.ReasoningContent = m.Reasoning
	}
	content, parts, imgs, err := contentOf(m.Content)
	if err != nil {
		return out, nil, err
	}
	out.Content, out.Parts = content, parts
	for j, c := range m.ToolCalls {
		args := string(c.Function.Arguments)
		var s string
		if json.Unmarshal(c.Function.Arguments, &s) == nil {
			args = s // OpenAI's form: a string holding the JSON
		}
		if len(bytes.TrimSpace(c.Function.Arguments)) == 0 {
			args = ""
		}
		if c.Function.Name == "" {
			return out, nil, fmt.Errorf("tool_calls[%d] has no function name", j)
		}
		out.ToolCalls = append(out.ToolCalls, cp.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: args})
	}
	return out, imgs, nil
}

// contentOf reads a content: a string, null, or parts. Text parts alone
// are joined into one string; with image_url parts the content stays parts,
// and each image (a data: URL) is decoded and returned in order.
func contentOf(raw json.RawMessage) (string, []cp.ContentPart, [][]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil, nil, nil
	}
	var parts []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		ImageURL json.RawMessage `json:"image_url"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", nil, nil, errors.New("content must be a string or an array of text and image_url parts")
	}
	var out []cp.ContentPart
	var imgs [][]byte
	var text strings.Builder
	for j, p := range parts {
		switch p.Type {
		case "text":
			out = append(out, cp.ContentPart{Type: cp.PartText, Text: p.Text})
			text.WriteString(p.Text)
		case "image_url":
			img, err := partImage(p.ImageURL)
			if err != nil {
				return "", nil, nil, fmt.Errorf("content[%d].image_url: %w", j, err)
			}
			out = append(out, cp.ContentPart{Type: cp.PartImage})
			imgs = append(imgs, img)
		default:
			return "", nil, nil, fmt.Errorf("content[%d] is of type %q: want text or image_url", j, p.Type)
		}
	}
	if len(imgs) == 0 {
		return text.String(), nil, nil, nil
	}
	return "", out, imgs, nil
}

// partImage decodes an image_url part's data: URL. submit reads no
// http(s) URLs: the coordinator's API fetches them only where its operator
// allows it, and a file on this machine is given with --image.
func partImage(raw json.RawMessage) ([]byte, error) {
	var iu struct {
		URL string `json:"url"`
	}
	if json.Unmarshal(raw, &iu) != nil {
		var u string
		if json.Unmarshal(raw, &u) != nil {
			return nil, errors.New(`want {"url": "data:image/png;base64,..."}`)
		}
		iu.URL = u
	}
	if !strings.HasPrefix(strings.ToLower(iu.URL), "data:") {
		return nil, fmt.Errorf("%q is not a data: URL: submit sends images inline; give a local file with --image, or write it as data:image/png;base64,...", clipText(iu.URL))
	}
	r := images.Reader{Limits: images.Limits{Bytes: cp.MaxMessageSize}}
	return r.Read(context.Background(), 0, iu.URL)
}

func clipText(s string) string {
	if len(s) > 48 {
		return s[:48] + "..."
	}
	return s
}

// chatPrinter prints a chat's reply as it streams: the think channel under
// "thinking:", the response under "response:", and the calls at the end.
type chatPrinter struct {
	w       io.Writer
	section string
}

func (p *chatPrinter) token(t cp.TokenMsg) {
	if t.Reasoning != "" {
		p.to("thinking")
		fmt.Fprint(p.w, client.Printable(t.Reasoning))
	}
	if t.Text != "" {
		p.to("response")
		fmt.Fprint(p.w, client.Printable(t.Text))
	}
}

func (p *chatPrinter) to(section string) {
	if p.section == section {
		return
	}
	if p.section != "" {
		fmt.Fprintln(p.w)
	}
	fmt.Fprintf(p.w, "%s:\n", section)
	p.section = section
}

// whole prints a reply at once (after a lost stream).
func (p *chatPrinter) whole(res *client.Result) {
	p.token(cp.TokenMsg{Reasoning: res.Reasoning, Text: res.Text})
}

// calls prints the reply's tool calls, one a line: NAME ARGUMENTS.
func (p *chatPrinter) calls(calls []cp.ToolCall) {
	for i, c := range calls {
		p.to("tool calls")
		if i > 0 {
			fmt.Fprintln(p.w)
		}
		fmt.Fprintf(p.w, "%s %s", c.Name, client.Printable(c.Arguments))
	}
}
