package tokenizer

import (
	"errors"
	"fmt"
	"strings"
)

// Message is one chat turn. Thinking is an assistant turn's reasoning.
type Message struct {
	Role     string // "system", "user", "assistant" or "tool"
	Content  string
	Thinking string
	// ToolCalls are the calls an assistant turn made, after its response.
	ToolCalls []ToolCall
	// ToolCallID is the call a tool turn answers.
	ToolCallID string
}

// ToolCall is one function call of an assistant turn: its id (given by
// the caller's side, not the model), the function's name and its
// arguments as the model wrote them (JSON, by convention).
type ToolCall struct {
	ID, Name, Arguments string
}

// ChatOptions controls how a conversation is rendered.
type ChatOptions struct {
	// OpenAssistant ends the prompt with an open assistant turn for the
	// model to continue.
	OpenAssistant bool
	// Thinking renders thinking mode: every assistant turn carries a think
	// channel (empty if it has no Thinking) and the open assistant turn
	// starts in it. Without it, Thinking is dropped and the open turn starts
	// in the response channel.
	Thinking bool
	// Tools declares the functions the model may call (their JSON
	// definitions), in a tools element before the first message.
	Tools string
	// CallName, with OpenAssistant, opens the assistant turn inside a call
	// of that function: the model writes its arguments. CallAny opens it
	// at a new element whose head the model writes (a call of any tool).
	// Both close the (empty) response channel first.
	CallName string
	CallAny  bool
}

// ErrChat reports a conversation that cannot be rendered.
var ErrChat = errors.New("tokenizer: bad chat")

// EncodeChat renders messages in K3's XTML framing. Each message is
//
//	<|open|>message role="ROLE"<|sep|>CONTENT<|close|>message<|sep|><|end_of_msg|>
//
// and an assistant message's content is its channels,
//
//	<|open|>think<|sep|>THINKING<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|>
//
// Tools, when given, come first as <|open|>tools<|sep|>TOOLS<|close|>tools<|sep|><|end_of_msg|>;
// an assistant message's calls follow its response channel, each
//
//	<|open|>tool_call id="ID" name="NAME"<|sep|>ARGUMENTS<|close|>tool_call<|sep|>
//
// and a tool message answers one call: <|open|>message role="tool" tool_call_id="ID"<|sep|>...
// Attribute values escape &, " and < as &amp; &quot; &lt;. (The released
// model's template for tools was not published with K3-SPEC; this is
// tandem's rendering of them in the same XTML grammar, and ParseReply
// reads the model's calls back in it.)
//
// The markers are special tokens; tag and attribute text and the contents
// are ordinary text, so marker names inside a message stay text and cannot
// forge structure.
func (t *Tokenizer) EncodeChat(msgs []Message, opts ChatOptions) ([]int, error) {
	open, ok1 := t.SpecialID(Open)
	closeID, ok2 := t.SpecialID(Close)
	sep, ok3 := t.SpecialID(Sep)
	eom, ok4 := t.SpecialID(EndOfMsg)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return nil, fmt.Errorf("%w: the tokenizer lacks the XTML specials %s %s %s %s", ErrChat, Open, Close, Sep, EndOfMsg)
	}
	var ids []int
	text := func(s string) { ids = append(ids, t.Encode(s)...) }
	// element opens <|open|>HEAD<|sep|>; its end is <|close|>NAME<|sep|>.
	start := func(head string) { ids = append(ids, open); text(head); ids = append(ids, sep) }
	end := func(name string) { ids = append(ids, closeID); text(name); ids = append(ids, sep) }

	if opts.Tools != "" {
		start("tools")
		text(opts.Tools)
		end("tools")
		ids = append(ids, eom)
	}
	for i, m := range msgs {
		if m.Thinking != "" && m.Role != "assistant" {
			return nil, fmt.Errorf("%w: message %d: a %s message cannot carry thinking", ErrChat, i, m.Role)
		}
		if len(m.ToolCalls) > 0 && m.Role != "assistant" {
			return nil, fmt.Errorf("%w: message %d: a %s message cannot carry tool calls", ErrChat, i, m.Role)
		}
		switch m.Role {
		case "system", "user":
			start(`message role="` + m.Role + `"`)
			text(m.Content)
		case "tool":
			if m.ToolCallID == "" {
				return nil, fmt.Errorf("%w: message %d: a tool message must name the call it answers (tool_call_id)", ErrChat, i)
			}
			start(`message role="tool" tool_call_id="` + escapeAttr(m.ToolCallID) + `"`)
			text(m.Content)
		case "assistant":
			start(`message role="assistant"`)
			if opts.Thinking {
				start("think")
				text(m.Thinking)
				end("think")
			}
			start("response")
			text(m.Content)
			end("response")
			for j, c := range m.ToolCalls {
				if c.Name == "" {
					return nil, fmt.Errorf("%w: message %d: tool call %d has no name", ErrChat, i, j)
				}
				start(callHead(c.ID, c.Name))
				text(c.Arguments)
				end(callTag)
			}
		default:
			return nil, fmt.Errorf("%w: message %d: role %q (want system, user, assistant or tool)", ErrChat, i, m.Role)
		}
		end("message")
		ids = append(ids, eom)
	}
	if opts.OpenAssistant {
		start(`message role="assistant"`)
		switch {
		case opts.CallName != "" || opts.CallAny:
			start("response")
			end("response")
			if opts.CallName != "" {
				start(callHead("", opts.CallName))
			} else {
				ids = append(ids, open)
			}
		case opts.Thinking:
			start("think")
		default:
			start("response")
		}
	}
	return ids, nil
}

// callTag names a tool call's element.
const callTag = "tool_call"

// callHead is a tool call's head; a call the model opens has no id.
func callHead(id, name string) string {
	h := callTag
	if id != "" {
		h += ` id="` + escapeAttr(id) + `"`
	}
	return h + ` name="` + escapeAttr(name) + `"`
}

var attrEscaper = strings.NewReplacer("&", "&amp;", `"`, "&quot;", "<", "&lt;")
var attrUnescaper = strings.NewReplacer("&amp;", "&", "&quot;", `"`, "&lt;", "<")

func escapeAttr(s string) string { return attrEscaper.Replace(s) }

// EndOfMessageID is the id of <|end_of_msg|>, the token that ends a turn:
// generation stops when the model emits it. It is -1 if the tokenizer has no
// such token.
func (t *Tokenizer) EndOfMessageID() int {
	if id, ok := t.SpecialID(EndOfMsg); ok {
		return id
	}
	return -1
}

// IsStop reports whether id ends generation (<|end_of_msg|>).
func (t *Tokenizer) IsStop(id int) bool {
	eom := t.EndOfMessageID()
	return eom >= 0 && id == eom
}
