package tokenizer

import (
	"errors"
	"fmt"
)

// Message is one chat turn. Thinking is an assistant turn's reasoning.
type Message struct {
	Role     string // "system", "user" or "assistant"
	Content  string
	Thinking string
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

	for i, m := range msgs {
		switch m.Role {
		case "system", "user":
			if m.Thinking != "" {
				return nil, fmt.Errorf("%w: message %d: a %s message cannot carry thinking", ErrChat, i, m.Role)
			}
			start(`message role="` + m.Role + `"`)
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
		default:
			return nil, fmt.Errorf("%w: message %d: role %q (want system, user or assistant)", ErrChat, i, m.Role)
		}
		end("message")
		ids = append(ids, eom)
	}
	if opts.OpenAssistant {
		start(`message role="assistant"`)
		if opts.Thinking {
			start("think")
		} else {
			start("response")
		}
	}
	return ids, nil
}

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
