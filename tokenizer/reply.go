package tokenizer

import (
	"strings"
)

// maxHead bounds an element head (or a closing name) the parser collects:
// a model writing noise must not grow it without end.
const maxHead = 1024

// ReplyDelta is what one generated token adds to an assistant turn: text of
// the response channel, or a part of a tool call. Call is -1 unless the
// delta belongs to tool call number Call; Start marks the token that opened
// it (Name and ID, as the model wrote them, are set then).
type ReplyDelta struct {
	Content   string
	Call      int
	Start     bool
	Name, ID  string
	Arguments string
}

// Empty reports whether the delta carries nothing.
func (d ReplyDelta) Empty() bool {
	return d.Content == "" && !d.Start && d.Arguments == ""
}

// ReplyParser reads an assistant turn token by token as the model generates
// it, in the framing EncodeChat writes: the response channel's text, and
// each tool call (its name, then its arguments) as it is written. It never
// fails: a model's malformed structure is skipped, special tokens never
// reach the text, and what it collects is bounded.
//
// A ReplyParser is not safe for concurrent use.
type ReplyParser struct {
	t                     *Tokenizer
	open, close, sep, eom int
	tools                 bool

	state   replyState
	channel channel // where text goes in stateText
	dec     *StreamDecoder
	head    []byte // the head or closing name being read
	calls   int    // calls started
	closed  int    // calls whose element was closed
	inCall  bool
}

type replyState int

const (
	stateText  replyState = iota // inside an element: text goes to channel
	stateHead                    // after <|open|>: reading the head up to <|sep|>
	stateClose                   // after <|close|>: reading the name up to <|sep|>
	stateDone                    // the message was closed
)

type channel int

const (
	chanNone     channel = iota // text between elements, or in an element we do not surface
	chanResponse                // the response channel
	chanCall                    // a tool call's arguments
)

// NewReplyParser returns a parser for the open assistant turn that
// EncodeChat with opts ends with. With tools false, tool calls the model
// writes are dropped rather than reported.
func (t *Tokenizer) NewReplyParser(opts ChatOptions, tools bool) *ReplyParser {
	p := &ReplyParser{t: t, open: -1, close: -1, sep: -1, eom: -1, tools: tools, dec: NewStreamDecoder(t)}
	for name, dst := range map[string]*int{Open: &p.open, Close: &p.close, Sep: &p.sep, EndOfMsg: &p.eom} {
		if id, ok := t.SpecialID(name); ok {
			*dst = id
		}
	}
	switch {
	case opts.CallName != "":
		p.channel, p.inCall, p.calls = chanCall, true, 1
	case opts.CallAny:
		p.state = stateHead
	case opts.Thinking:
		p.channel = chanNone
	default:
		p.channel = chanResponse
	}
	return p
}

// Calls is the number of tool calls started; Closed the number whose
// element the model closed (complete calls).
func (p *ReplyParser) Calls() int  { return p.calls }
func (p *ReplyParser) Closed() int { return p.closed }

// Push reads one generated token.
func (p *ReplyParser) Push(id int) ReplyDelta {
	none := ReplyDelta{Call: -1}
	if p.state == stateDone || id == p.eom {
		return p.finish()
	}
	if !p.t.IsSpecial(id) {
		if id < 0 || id >= p.t.VocabSize() {
			return none
		}
		switch p.state {
		case stateHead, stateClose:
			if len(p.head) < maxHead {
				p.head = append(p.head, p.t.v.bytes(id)...)
			}
			return none
		}
		piece, _ := p.dec.Push(id)
		return p.text(piece)
	}
	switch id {
	case p.open:
		d := p.flush()
		p.state, p.head = stateHead, p.head[:0]
		return d
	case p.close:
		d := p.flush()
		p.state, p.head = stateClose, p.head[:0]
		return d
	case p.sep:
		switch p.state {
		case stateHead:
			return p.element(string(p.head))
		case stateClose:
			name := strings.TrimSpace(string(p.head))
			p.state, p.channel = stateText, chanNone
			if name == callTag && p.inCall {
				p.inCall = false
				p.closed++
			}
			if name == "message" {
				p.state = stateDone
			}
		}
		return none
	}
	return none // another special token: not text
}

// Finish flushes what the decoder holds back at the end of generation.
func (p *ReplyParser) Finish() ReplyDelta { return p.finish() }

func (p *ReplyParser) finish() ReplyDelta {
	d := p.flush()
	p.state = stateDone
	return d
}

// flush ends a run of text: the bytes held back for an unfinished
// character go to the current channel.
func (p *ReplyParser) flush() ReplyDelta {
	if p.state != stateText {
		return ReplyDelta{Call: -1}
	}
	return p.text(p.dec.Flush())
}

func (p *ReplyParser) text(s string) ReplyDelta {
	d := ReplyDelta{Call: -1}
	if s == "" || p.state != stateText {
		return d
	}
	switch p.channel {
	case chanResponse:
		d.Content = s
	case chanCall:
		if p.tools {
			d.Call, d.Arguments = p.calls-1, s
		}
	}
	return d
}

// element opens the element whose head was read.
func (p *ReplyParser) element(head string) ReplyDelta {
	d := ReplyDelta{Call: -1}
	p.state, p.channel = stateText, chanNone
	name, attrs := parseHead(head)
	switch name {
	case "response":
		p.channel = chanResponse
	case callTag:
		if attrs["name"] == "" || p.inCall {
			return d // a call without a name, or inside a call: noise
		}
		p.channel, p.inCall = chanCall, true
		p.calls++
		if p.tools {
			d.Call, d.Start, d.Name, d.ID = p.calls-1, true, attrs["name"], attrs["id"]
		}
	}
	return d
}

// parseHead splits an element head, `name key="value" ...`, into its name
// and attributes; it is lenient, a malformed attribute ends the list.
func parseHead(head string) (string, map[string]string) {
	head = strings.TrimSpace(head)
	name, rest, _ := strings.Cut(head, " ")
	attrs := map[string]string{}
	for {
		rest = strings.TrimSpace(rest)
		key, after, ok := strings.Cut(rest, `="`)
		if !ok || key == "" || strings.ContainsAny(key, " \"") {
			return name, attrs
		}
		val, next, ok := strings.Cut(after, `"`)
		if !ok {
			return name, attrs
		}
		attrs[key] = attrUnescaper.Replace(val)
		rest = next
	}
}
