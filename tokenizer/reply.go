package tokenizer

import (
	"encoding/json"
	"strings"

	"github.com/tandem-inference/tandem/internal/pyquote"
)

// maxHead bounds an element head (or a closing name) the parser collects:
// a model writing noise must not grow it without end.
const maxHead = 1024

// ReplyDelta is what one generated token adds to an assistant turn: text
// of the think channel (Reasoning) or of the response channel (Content),
// or a part of a tool call. Call is -1 unless the delta belongs to tool
// call number Call; Start marks the token that opened it (Name is set
// then). Arguments is the next piece of the call's arguments, rebuilt as
// one JSON object from its typed argument elements.
type ReplyDelta struct {
	Reasoning string
	Content   string
	Call      int
	Start     bool
	Name      string
	Arguments string
}

// Empty reports whether the delta carries nothing.
func (d ReplyDelta) Empty() bool {
	return d.Reasoning == "" && d.Content == "" && !d.Start && d.Arguments == ""
}

// ReplyOptions says how the assistant turn being read was opened.
type ReplyOptions struct {
	// Thinking: the generation prompt opened the think channel (else the
	// response channel).
	Thinking bool
	// Tools: report the tools element's calls. Without it a tools element
	// is kept as text in the content.
	Tools bool
}

// ReplyParser reads an assistant turn token by token as K3 writes it:
//
//	THINKING<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|>
//	<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
//	<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>...
//	<|close|>call<|sep|>...<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>
//
// Each call's arguments are rebuilt as a JSON object (string values
// quoted, other values as written); a call whose arguments the model wrote
// as a json block keeps that block's text. It never fails and loses no
// text: structure it cannot read goes to the content as the model wrote
// it (markers by name) and Malformed reports it; special tokens other than
// the markers are not text. What it collects is bounded.
//
// A ReplyParser is not safe for concurrent use.
type ReplyParser struct {
	t                     *Tokenizer
	open, close, sep, eom int
	tools                 bool

	dec       *StreamDecoder
	stack     []element // open elements, the message first
	head      []byte    // the head or closing name being read
	reading   int       // 0, or open or close: the marker whose head is being read
	done      bool      // nothing more is read
	closedMsg bool      // the model closed the message
	calls     int       // calls started
	closed    int       // calls closed
	args      int       // arguments of the current call
	value     strings.Builder
	malformed bool
}

type element struct {
	name  string
	attrs map[string]string
	text  bool // an argument of type string: its value is quoted
}

// NewReplyParser returns a parser for the assistant turn that a prompt of
// RenderChat left open.
func (t *Tokenizer) NewReplyParser(opts ReplyOptions) *ReplyParser {
	p := &ReplyParser{t: t, open: -1, close: -1, sep: -1, eom: -1, tools: opts.Tools, dec: NewStreamDecoder(t)}
	for name, dst := range map[string]*int{Open: &p.open, Close: &p.close, Sep: &p.sep, EndOfMsg: &p.eom} {
		if id, ok := t.SpecialID(name); ok {
			*dst = id
		}
	}
	p.stack = []element{{name: "message"}, {name: "response"}}
	if opts.Thinking {
		p.stack[1].name = "think"
	}
	return p
}

// Calls is the number of tool calls started; Closed the number whose
// element the model closed.
func (p *ReplyParser) Calls() int  { return p.calls }
func (p *ReplyParser) Closed() int { return p.closed }

// Malformed reports that the turn held structure the parser could not
// read (kept as content), or ended inside an element.
func (p *ReplyParser) Malformed() bool { return p.malformed }

// Done reports that the model closed the message.
func (p *ReplyParser) Done() bool { return p.closedMsg }

// Push reads one generated token.
func (p *ReplyParser) Push(id int) ReplyDelta {
	none := ReplyDelta{Call: -1}
	if p.done {
		return none
	}
	if id == p.eom {
		return p.Finish()
	}
	if !p.t.IsSpecial(id) {
		if id < 0 || id >= p.t.VocabSize() {
			return none
		}
		if p.reading != 0 {
			if len(p.head) < maxHead {
				p.head = append(p.head, p.t.v.bytes(id)...)
			}
			return none
		}
		piece, _ := p.dec.Push(id)
		return p.text(piece)
	}
	switch id {
	case p.open, p.close:
		d := p.flush()
		if p.reading != 0 {
			d = merge(d, p.stray()) // a head left unfinished
		}
		p.reading, p.head = id, p.head[:0]
		return d
	case p.sep:
		if p.reading == 0 {
			return p.kept(Sep)
		}
		head := ToValidUTF8(p.head)
		marker := p.reading
		p.reading, p.head = 0, p.head[:0]
		if marker == p.open {
			return p.start(head)
		}
		return p.end(strings.TrimSpace(head))
	}
	return none // another special token: not text
}

// Finish ends the turn: it flushes what the decoder holds back and closes
// what the model left open. The turn is malformed unless the model closed
// its message.
func (p *ReplyParser) Finish() ReplyDelta {
	if p.done {
		return ReplyDelta{Call: -1}
	}
	d := p.flush()
	if p.reading != 0 {
		d = merge(d, p.stray())
	}
	p.done = true
	if len(p.stack) > 0 {
		p.malformed = true
	}
	return d
}

// flush ends a run of text: the bytes held back for an unfinished
// character go where the text was going.
func (p *ReplyParser) flush() ReplyDelta {
	return p.text(p.dec.Flush())
}

func (p *ReplyParser) top() *element {
	if len(p.stack) == 0 {
		return nil
	}
	return &p.stack[len(p.stack)-1]
}

// text routes text by the element it is in.
func (p *ReplyParser) text(s string) ReplyDelta {
	d := ReplyDelta{Call: -1}
	if s == "" {
		return d
	}
	top := p.top()
	switch {
	case top == nil:
		d.Content = s // after the message: kept
		p.malformed = true
	case top.name == "think":
		d.Reasoning = s
	case top.name == "response" || top.name == "raw":
		d.Content = s
	case top.name == "argument":
		p.value.WriteString(s)
		d.Call = p.calls - 1
		if top.text {
			d.Arguments = jsonEscape(s)
		} else {
			d.Arguments = s
		}
	case top.name == "json":
		d.Call, d.Arguments = p.calls-1, s
	case strings.TrimSpace(s) == "":
		// whitespace between elements
	default:
		d.Content = s
		p.malformed = true
	}
	return d
}

// start opens the element whose head was read, if it may stand where it
// is; otherwise the head is kept as text.
func (p *ReplyParser) start(head string) ReplyDelta {
	name, attrs, ok := parseHead(head)
	top := p.top()
	parent := ""
	if top != nil {
		parent = top.name
	}
	d := ReplyDelta{Call: -1}
	switch {
	case !ok:
	case parent == "message" && (name == "think" || name == "response") && len(attrs) == 0:
		p.stack = append(p.stack, element{name: name})
		return d
	case parent == "message" && name == "tools" && len(attrs) == 0 && !p.tools:
		p.stack = append(p.stack, element{name: "raw"}) // kept as text
		return p.text(Open + head + Sep)
	case parent == "message" && name == "tools" && len(attrs) == 0:
		p.stack = append(p.stack, element{name: name})
		return d
	case parent == "tools" && name == "call" && attrs["tool"] != "":
		p.stack = append(p.stack, element{name: name, attrs: attrs})
		p.calls++
		p.args = 0
		return ReplyDelta{Call: p.calls - 1, Start: true, Name: attrs["tool"]}
	case parent == "call" && name == "json" && p.args == 0:
		p.stack = append(p.stack, element{name: name})
		p.args = -1 // the block is the arguments
		return d
	case parent == "call" && name == "argument" && p.args >= 0 && validType[attrs["type"]]:
		if _, ok := attrs["key"]; !ok {
			break
		}
		e := element{name: name, attrs: attrs, text: attrs["type"] == "string"}
		p.stack = append(p.stack, e)
		p.value.Reset()
		sep := "{"
		if p.args > 0 {
			sep = ", "
		}
		p.args++
		d.Call, d.Arguments = p.calls-1, sep+jsonQuote(attrs["key"])+": "
		if e.text {
			d.Arguments += `"`
		}
		return d
	case parent == "raw":
		p.stack = append(p.stack, element{name: "raw"})
		return p.text(Open + head + Sep)
	}
	return p.kept(Open + head + Sep)
}

// end closes the element named name if it is the one open; otherwise the
// closing is kept as text.
func (p *ReplyParser) end(name string) ReplyDelta {
	top := p.top()
	if top == nil {
		return p.kept(Close + name + Sep)
	}
	if top.name == "raw" {
		d := p.text(Close + name + Sep)
		p.stack = p.stack[:len(p.stack)-1]
		return d
	}
	if top.name != name {
		return p.kept(Close + name + Sep)
	}
	d := ReplyDelta{Call: -1}
	switch name {
	case "argument":
		if top.text {
			d.Call, d.Arguments = p.calls-1, `"`
		} else if !validValue(top.attrs["type"], p.value.String()) {
			p.malformed = true
		}
	case "call":
		d.Call = p.calls - 1
		switch {
		case p.args == 0:
			d.Arguments = "{}"
		case p.args > 0:
			d.Arguments = "}"
		}
		p.closed++
	case "message":
		p.done, p.closedMsg = true, true
	}
	p.stack = p.stack[:len(p.stack)-1]
	return d
}

// kept puts structure the parser cannot read into the content.
func (p *ReplyParser) kept(s string) ReplyDelta {
	p.malformed = true
	return ReplyDelta{Call: -1, Content: s}
}

// stray keeps a head that a marker interrupted.
func (p *ReplyParser) stray() ReplyDelta {
	m := Open
	if p.reading == p.close {
		m = Close
	}
	s := m + ToValidUTF8(p.head)
	p.reading, p.head = 0, p.head[:0]
	return p.kept(s)
}

// merge joins two deltas of which at most one belongs to a call.
func merge(a, b ReplyDelta) ReplyDelta {
	a.Reasoning += b.Reasoning
	a.Content += b.Content
	if b.Call >= 0 {
		a.Call, a.Start, a.Name = b.Call, a.Start || b.Start, b.Name
		a.Arguments += b.Arguments
	}
	return a
}

var validType = map[string]bool{"string": true, "number": true, "boolean": true, "null": true, "object": true, "array": true}

// validValue reports whether an argument's text is a JSON value of its
// type.
func validValue(typ, v string) bool {
	var x any
	if json.Unmarshal([]byte(v), &x) != nil {
		return false
	}
	switch x.(type) {
	case float64:
		return typ == "number"
	case bool:
		return typ == "boolean"
	case nil:
		return typ == "null"
	case map[string]any:
		return typ == "object"
	case []any:
		return typ == "array"
	}
	return false // a JSON string is written raw, with type string
}

// jsonQuote is s as a JSON string.
func jsonQuote(s string) string { return `"` + jsonEscape(s) + `"` }

// jsonEscape is s escaped for the inside of a JSON string.
func jsonEscape(s string) string {
	var b strings.Builder
	pyquote.Write(&b, s)
	out := b.String()
	return out[1 : len(out)-1]
}

// parseHead splits an element head, `name key="value" ...`, into its name
// and attributes, as the renderer writes it; ok is false if it is not
// such a head.
func parseHead(head string) (name string, attrs map[string]string, ok bool) {
	name, rest, _ := strings.Cut(head, " ")
	if name == "" || strings.ContainsAny(name, `="`) {
		return "", nil, false
	}
	attrs = map[string]string{}
	for rest != "" {
		key, after, found := strings.Cut(rest, `="`)
		if !found || key == "" || strings.ContainsAny(key, " \"") {
			return "", nil, false
		}
		val, next, found := strings.Cut(after, `"`)
		if !found {
			return "", nil, false
		}
		attrs[key] = attrUnescaper.Replace(val)
		rest = strings.TrimPrefix(next, " ")
		if rest == next && rest != "" {
			return "", nil, false
		}
	}
	return name, attrs, true
}

var attrUnescaper = strings.NewReplacer("&amp;", "&", "&quot;", `"`)
