package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Chat is an OpenAI-shaped chat request, the part of it that decides the
// prompt: it unmarshals from a chat completions request body.
type Chat struct {
	Messages []ChatMessage `json:"messages"`
	// Tools are OpenAI tool objects ({"type": "function", "function":
	// {...}}), declared to the model as written, keys sorted.
	Tools []json.RawMessage `json:"tools,omitempty"`
	// ToolChoice: "required" and "none" add K3's tool-choice message; a
	// named function or "auto" add nothing to the prompt.
	ToolChoice json.RawMessage `json:"tool_choice,omitempty"`
	// ResponseFormat: {"type": "json_object"} or {"type": "json_schema",
	// "json_schema": {"schema": ...}} add K3's response-format message.
	ResponseFormat json.RawMessage `json:"response_format,omitempty"`
	// ReasoningEffort is OpenAI's parameter: see Thinking.
	ReasoningEffort string `json:"reasoning_effort,omitempty"`
	// NoGenerationPrompt leaves the prompt without the open assistant turn
	// (a history rendered for its own sake).
	NoGenerationPrompt bool `json:"-"`
	// Images, when set, are the sizes of the chat's images, one per image
	// part in order: each part renders K3's media marker (MediaMarker),
	// and encoding expands its pad to the image's feature rows. Nil
	// renders each image part as ImagePlaceholder, as the released
	// renderer does without image prompts.
	Images []ChatImage `json:"-"`
}

// ChatImage is what the prompt needs of an image: its size as the marker
// writes it and its number of feature rows.
type ChatImage struct {
	Width, Height int
	Rows          int
}

// MediaMarker is the text an image of w x h pixels renders in a prompt, as
// the released processor writes it (make_image_prompt): the media
// specials around "image WxH" and one pad, which encoding expands to the
// image's feature rows.
func MediaMarker(w, h int) string {
	return MediaBegin + "image " + strconv.Itoa(w) + "x" + strconv.Itoa(h) + MediaContent + MediaPad + MediaEnd
}

// ChatMessage is one OpenAI chat message.
type ChatMessage struct {
	Role string `json:"role"`
	Name string `json:"name,omitempty"`
	// Content is a string, null, or an array of parts ({"type": "text",
	// "text": ...}; image parts render K3's image placeholder).
	Content json.RawMessage `json:"content,omitempty"`
	// ReasoningContent (or Reasoning, its other spelling) is an assistant
	// turn's thinking.
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	Reasoning        string         `json:"reasoning,omitempty"`
	ToolCalls        []ChatToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool message answers; Tool names its
	// function (K3's own field; else Name, else the call's name).
	ToolCallID string `json:"tool_call_id,omitempty"`
	Tool       string `json:"tool,omitempty"`
	// Tools, on a system message, declares tools mid-conversation.
	Tools json.RawMessage `json:"tools,omitempty"`
}

// Text returns a message of role whose content is the string content.
func Text(role, content string) ChatMessage {
	b, _ := json.Marshal(content)
	return ChatMessage{Role: role, Content: b}
}

// ChatToolCall is one call of an assistant message.
type ChatToolCall struct {
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function ChatFunctionCall `json:"function"`
}

// ChatFunctionCall is a call's function: its name and its arguments, a
// JSON string holding a JSON object (OpenAI's form) or the object itself.
type ChatFunctionCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// Segment is a piece of a rendered prompt. Special segments are K3's
// markers, encoded with special tokens allowed; every other segment is
// ordinary text, where special-token names stay text.
type Segment struct {
	Text    string `json:"text"`
	Special bool   `json:"special"`
	// Rows, on an image's marker, is the number of pad ids its one pad
	// becomes (the image's feature rows).
	Rows int `json:"rows,omitempty"`
}

// ErrChat reports a conversation that cannot be rendered.
var ErrChat = errors.New("tokenizer: bad chat")

// ImagePlaceholder is what an image part of a message renders.
const ImagePlaceholder = "<|kimi_image_placeholder|>"

// Thinking efforts K3 accepts.
var thinkingEfforts = map[string]bool{"low": true, "high": true, "max": true}

// Thinking reads OpenAI's reasoning_effort as K3's thinking mode: "" is
// K3's default (thinking, effort max), "none" turns thinking off, and low,
// high and max are K3's efforts. tandem maps OpenAI's other names to the
// nearest effort K3 knows: minimal to low, medium to high, xhigh to max.
func Thinking(reasoningEffort string) (on bool, effort string, err error) {
	switch reasoningEffort {
	case "":
		return true, "max", nil
	case "none":
		return false, "", nil
	case "minimal":
		return true, "low", nil
	case "medium":
		return true, "high", nil
	case "xhigh":
		return true, "max", nil
	}
	if thinkingEfforts[reasoningEffort] {
		return true, reasoningEffort, nil
	}
	return false, "", fmt.Errorf("%w: reasoning_effort %q: K3 thinks at low, high or max (tandem also reads minimal as low, medium as high, xhigh as max), or not at all with none", ErrChat, reasoningEffort)
}

// ChatToolChoice returns the request's tool_choice when it is a string
// ("auto", "none", "required"), and "" for a named function or none given.
func (c *Chat) ChatToolChoice() string {
	var s string
	if json.Unmarshal(c.ToolChoice, &s) == nil {
		return s
	}
	return ""
}

// ResponseFormatType returns response_format's type ("" when absent).
func (c *Chat) ResponseFormatType() string {
	v, err := c.responseFormat()
	if err != nil {
		return ""
	}
	switch v.kind {
	case pyString:
		return v.str
	case pyObject:
		if t, ok := v.get("type"); ok && t.kind == pyString {
			return t.str
		}
	}
	return ""
}

func (c *Chat) responseFormat() (pyValue, error) {
	if len(bytes.TrimSpace(c.ResponseFormat)) == 0 {
		return pyValue{}, nil
	}
	return parsePyJSON(string(c.ResponseFormat))
}

// ResponseSchema returns the JSON schema of a json_schema response_format
// as the released renderer finds it (json_schema.schema, else
// json_schema.json_schema, else json_schema itself), or nil.
func (c *Chat) ResponseSchema() json.RawMessage {
	rf, err := c.responseFormat()
	if err != nil {
		return nil
	}
	s, ok := responseSchema(rf)
	if !ok {
		return nil
	}
	return json.RawMessage(s.dump(dumpCompact))
}

func responseSchema(rf pyValue) (pyValue, bool) {
	if rf.kind != pyObject {
		return pyValue{}, false
	}
	js, ok := rf.get("json_schema")
	if !ok || js.kind == pyNull {
		return pyValue{}, false
	}
	if js.kind != pyObject {
		return js, true
	}
	if s, ok := js.get("schema"); ok {
		return s, s.kind != pyNull
	}
	if s, ok := js.get("json_schema"); ok {
		return s, s.kind != pyNull
	}
	return js, true
}

// RenderChat renders c as K3's released renderer (encoding_k3.py's
// build_chat_segments) does, segment for segment: the tool declarations,
// the thinking-effort message, the messages (developer and unknown roles
// render nothing, as there), the tool-choice and response-format messages
// and the generation prompt. Tool results are put in their calls' order.
func RenderChat(c *Chat) ([]Segment, error) {
	thinking, effort, err := Thinking(c.ReasoningEffort)
	if err != nil {
		return nil, err
	}
	r := &renderer{thinking: thinking, images: c.Images}
	msgs := sortToolResults(c.Messages)
	if len(c.Tools) > 0 {
		tools, err := rawList(c.Tools)
		if err != nil {
			return nil, fmt.Errorf("%w: tools: %v", ErrChat, err)
		}
		r.toolDeclare(tools.sorted(), false)
	}
	if thinking {
		r.system("thinking-effort", "`thinking_effort` guides on how much to think in your thinking channel "+
			"(not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"+
			"Now the system is invoked with `thinking_effort="+effort+"`.")
	}
	for i := range msgs {
		if err := r.message(&msgs[i]); err != nil {
			return nil, fmt.Errorf("%w: messages[%d]: %v", ErrChat, msgs[i].index, err)
		}
	}
	switch c.ChatToolChoice() {
	case "required":
		r.system("tool-choice", "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.")
	case "none":
		r.system("tool-choice", "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.")
	}
	rf, err := c.responseFormat()
	if err != nil {
		return nil, fmt.Errorf("%w: response_format: %v", ErrChat, err)
	}
	const raw = "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting."
	switch c.ResponseFormatType() {
	case "json_object":
		r.system("response-format", "The system is invoked with `response_format=json_object`.\n"+raw)
	case "json_schema":
		schema, _ := responseSchema(rf) // absent: null, as there
		r.system("response-format", "The system is invoked with `response_format=json_schema`.\n"+raw+
			"\nThe JSON data must match the following schema:\n```json\n"+schema.sorted().dump(dumpCompact)+"\n```")
	}
	if r.images != nil && r.image != len(r.images) {
		return nil, fmt.Errorf("%w: %d images for %d image parts", ErrChat, len(r.images), r.image)
	}
	if !c.NoGenerationPrompt {
		r.open("message", "role", "assistant")
		if thinking {
			r.open("think")
		} else {
			r.open("response")
		}
	}
	return r.out, nil
}

// EncodeSegments returns the ids of segments, each encoded apart: markers
// as special tokens, everything else as ordinary text.
func (t *Tokenizer) EncodeSegments(segs []Segment) ([]int, error) {
	var ids []int
	for _, s := range segs {
		if !s.Special {
			ids = append(ids, t.Encode(s.Text)...)
			continue
		}
		more, err := t.EncodeWithSpecials(s.Text)
		if err != nil {
			return nil, err
		}
		if s.Rows > 0 {
			if more, err = t.expandPad(more, s.Rows); err != nil {
				return nil, err
			}
		}
		ids = append(ids, more...)
	}
	return ids, nil
}

// expandPad replaces the one MediaPad id of an image's marker with rows
// of them: one prompt position per feature row.
func (t *Tokenizer) expandPad(ids []int, rows int) ([]int, error) {
	pad, ok := t.SpecialID(MediaPad)
	if !ok {
		return nil, fmt.Errorf("%w: the tokenizer lacks %s, so it cannot hold images", ErrChat, MediaPad)
	}
	at := slices.Index(ids, pad)
	if at < 0 || slices.Index(ids[at+1:], pad) >= 0 {
		return nil, fmt.Errorf("%w: an image marker must hold one %s", ErrChat, MediaPad)
	}
	out := make([]int, 0, len(ids)-1+rows)
	out = append(out, ids[:at]...)
	for range rows {
		out = append(out, pad)
	}
	return append(out, ids[at+1:]...), nil
}

// EncodeChat renders c (RenderChat) and encodes it (EncodeSegments).
func (t *Tokenizer) EncodeChat(c *Chat) ([]int, error) {
	for _, m := range []string{Open, Close, Sep, EndOfMsg} {
		if _, ok := t.SpecialID(m); !ok {
			return nil, fmt.Errorf("%w: the tokenizer lacks the XTML special %s", ErrChat, m)
		}
	}
	segs, err := RenderChat(c)
	if err != nil {
		return nil, err
	}
	return t.EncodeSegments(segs)
}

// indexed is a message and its place in the request (for errors).
type indexed struct {
	ChatMessage
	index int
}

// sortToolResults puts each run of tool messages in the order of the
// calls they answer, matched by tool_call_id to the latest assistant
// message's calls, and names each by its call's function. A run with a
// message that matches no call is left as it is (the released renderer's
// normalize_xtml_tool_result_messages).
func sortToolResults(msgs []ChatMessage) []indexed {
	out := make([]indexed, 0, len(msgs))
	type call struct {
		pos  int
		name string
	}
	var calls map[string]call
	for i := 0; i < len(msgs); {
		m := msgs[i]
		if m.Role == "assistant" {
			calls = map[string]call{}
			for j, c := range m.ToolCalls {
				if _, dup := calls[c.ID]; !dup && c.ID != "" {
					calls[c.ID] = call{j + 1, c.Function.Name}
				}
			}
		}
		if m.Role != "tool" {
			out = append(out, indexed{m, i})
			i++
			continue
		}
		type result struct {
			indexed
			pos int
		}
		var run []result
		resolved := true
		for ; i < len(msgs) && msgs[i].Role == "tool"; i++ {
			c, ok := calls[msgs[i].ToolCallID]
			if !ok || msgs[i].ToolCallID == "" {
				resolved = false
			}
			r := result{indexed{msgs[i], i}, c.pos}
			if ok {
				r.Tool = c.name
				if r.Name != "" {
					r.Name = c.name
				}
			}
			run = append(run, r)
		}
		if resolved {
			sort.SliceStable(run, func(a, b int) bool { return run[a].pos < run[b].pos })
		}
		for _, r := range run {
			if !resolved {
				r.indexed = indexed{msgs[r.index], r.index}
			}
			out = append(out, r.indexed)
		}
	}
	return out
}

// renderer collects segments.
type renderer struct {
	out      []Segment
	thinking bool
	images   []ChatImage    // nil: image parts render ImagePlaceholder
	image    int            // image parts rendered
	calls    []ChatToolCall // the latest assistant message's
	results  int            // tool messages since it
}

func (r *renderer) text(s string) {
	if s != "" {
		r.out = append(r.out, Segment{Text: s})
	}
}

func (r *renderer) control(s string) { r.out = append(r.out, Segment{Text: s, Special: true}) }

// userText writes text of a message, a reasoning or a call: with images,
// the released renderer reads ImagePlaceholder in such text as an image
// of its own, which tandem's images (one per image part) then lack; it
// is refused here with the reason.
func (r *renderer) userText(s string) error {
	if r.images != nil && strings.Contains(s, ImagePlaceholder) {
		return fmt.Errorf("holds %s, which K3's renderer reads as an image; send images as image parts", ImagePlaceholder)
	}
	r.text(s)
	return nil
}

// imagePart writes an image part: its marker, or the placeholder.
func (r *renderer) imagePart() error {
	if r.images == nil {
		r.control(ImagePlaceholder)
		return nil
	}
	if r.image >= len(r.images) {
		return fmt.Errorf("image part #%d has no image (%d given)", r.image+1, len(r.images))
	}
	im := r.images[r.image]
	if im.Width <= 0 || im.Height <= 0 || im.Rows <= 0 {
		return fmt.Errorf("image #%d is %dx%d with %d feature rows: want positive sizes", r.image+1, im.Width, im.Height, im.Rows)
	}
	r.image++
	r.out = append(r.out, Segment{Text: MediaMarker(im.Width, im.Height), Special: true, Rows: im.Rows})
	return nil
}

var attrEscaper = strings.NewReplacer("&", "&amp;", `"`, "&quot;")

// open writes <|open|>TAG key="value"...<|sep|>, each piece its own
// segment.
func (r *renderer) open(tag string, attrs ...string) {
	r.control(Open)
	r.text(tag)
	for i := 0; i+1 < len(attrs); i += 2 {
		r.text(" " + attrs[i])
		r.text(`="`)
		r.text(attrEscaper.Replace(attrs[i+1]))
		r.text(`"`)
	}
	r.control(Sep)
}

func (r *renderer) close(tag string) {
	r.control(Close)
	r.text(tag)
	r.control(Sep)
}

// system writes one of K3's internal system messages.
func (r *renderer) system(kind, body string) {
	r.open("message", "role", "system", "type", kind)
	r.text(pyStrip(body))
	r.close("message")
	r.control(EndOfMsg)
}

func (r *renderer) toolDeclare(tools pyValue, dynamic bool) {
	head := "# Tools\nHere are the available tools, described in JSONSchema.\n\n"
	if dynamic {
		head = "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n" +
			"You have access to all existing and extended tools.\nHere are the specs for the extended tools.\n\n"
	}
	r.open("message", "role", "system", "type", "tool-declare")
	r.text(head + "```json\n" + tools.dump(dumpCompact) + "\n```")
	r.close("message")
	r.control(EndOfMsg)
}

func (r *renderer) message(m *indexed) error {
	switch m.Role {
	case "user", "system":
		if m.Role == "system" && len(bytes.TrimSpace(m.Tools)) > 0 {
			tools, err := parsePyJSON(string(m.Tools))
			if err != nil {
				return fmt.Errorf("tools: %v", err)
			}
			if tools.truthy() {
				r.toolDeclare(tools.sorted(), true)
				return nil
			}
		}
		attrs := []string{"role", m.Role}
		if m.Name != "" {
			attrs = append(attrs, "name", m.Name)
		}
		r.open("message", attrs...)
		if err := r.content(m.Content); err != nil {
			return err
		}
	case "tool":
		r.results++
		name := m.Tool
		if name == "" {
			name = m.Name
		}
		if name == "" && r.results <= len(r.calls) {
			name = r.calls[r.results-1].Function.Name
		}
		if name == "" {
			return errors.New("a tool message needs a tool name: give tool or name, or answer the calls of the assistant message before it in order")
		}
		r.open("message", "role", "tool", "tool", name, "index", strconv.Itoa(r.results))
		if err := r.content(m.Content); err != nil {
			return err
		}
	case "assistant":
		r.calls, r.results = m.ToolCalls, 0
		attrs := []string{"role", "assistant"}
		if m.Name != "" {
			attrs = append(attrs, "name", m.Name)
		}
		r.open("message", attrs...)
		if err := r.assistant(m); err != nil {
			return err
		}
	default:
		return nil // the released renderer writes nothing for other roles
	}
	r.close("message")
	r.control(EndOfMsg)
	return nil
}

// content writes a message's content: a string, or its parts in order.
func (r *renderer) content(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("content: %v", err)
		}
		return r.userText(s)
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return errors.New("content must be a string, null or an array of parts")
	}
	for j, p := range parts {
		switch {
		case p.Type == "image" || p.Type == "image_url":
			if err := r.imagePart(); err != nil {
				return fmt.Errorf("content[%d]: %v", j, err)
			}
		case p.Text == nil:
			return fmt.Errorf("content[%d] of type %q has no text", j, p.Type)
		default:
			if err := r.userText(*p.Text); err != nil {
				return fmt.Errorf("content[%d]: %v", j, err)
			}
		}
	}
	return nil
}

func (r *renderer) assistant(m *indexed) error {
	if r.thinking {
		reasoning := m.ReasoningContent
		if reasoning == "" {
			reasoning = m.Reasoning
		}
		r.open("think")
		if pyStrip(reasoning) != "" {
			if err := r.userText(reasoning); err != nil {
				return fmt.Errorf("reasoning_content: %v", err)
			}
		}
		r.close("think")
	}
	r.open("response")
	if err := r.content(m.Content); err != nil {
		return err
	}
	r.close("response")
	if len(m.ToolCalls) == 0 {
		return nil
	}
	r.open("tools")
	for j, c := range m.ToolCalls {
		r.open("call", "tool", c.Function.Name, "index", strconv.Itoa(j+1))
		args, block, err := callArguments(c.Function.Arguments)
		if err != nil {
			return fmt.Errorf("tool_calls[%d].function.arguments: %v", j, err)
		}
		if block != "" {
			r.open("json", "type", "object")
			if err := r.userText(block); err != nil {
				return fmt.Errorf("tool_calls[%d].function.arguments: %v", j, err)
			}
			r.close("json")
		}
		for k, key := range args.keys {
			v := args.vals[k]
			r.open("argument", "key", key, "type", xtmlType(v))
			val := v.dump(dumpDefault)
			if v.kind == pyString {
				val = v.str
			}
			if err := r.userText(val); err != nil {
				return fmt.Errorf("tool_calls[%d].function.arguments[%q]: %v", j, key, err)
			}
			r.close("argument")
		}
		r.close("call")
	}
	r.close("tools")
	return nil
}

// callArguments reads a call's arguments as the released renderer does:
// absent, null or a blank string is no arguments; an object, or a string
// holding one, its keys in order; a string that is not JSON is kept whole
// as a json block. Other values are refused.
func callArguments(raw json.RawMessage) (args pyValue, block string, err error) {
	args.kind = pyObject
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return args, "", nil
	}
	v, err := parsePyJSON(string(raw))
	if err != nil {
		return args, "", err
	}
	switch v.kind {
	case pyNull:
		return args, "", nil
	case pyObject:
		return v, "", nil
	case pyString:
	default:
		return args, "", errors.New("must be a JSON object or a string holding one")
	}
	if pyStrip(v.str) == "" {
		return args, "", nil
	}
	parsed, perr := parsePyJSON(v.str)
	if perr != nil {
		return args, v.str, nil
	}
	if parsed.kind != pyObject {
		return args, "", errors.New("the arguments must be a JSON object")
	}
	return parsed, "", nil
}

// xtmlType is an argument's type attribute.
func xtmlType(v pyValue) string {
	switch v.kind {
	case pyBool:
		return "boolean"
	case pyNull:
		return "null"
	case pyInt, pyFloat:
		return "number"
	case pyString:
		return "string"
	case pyObject:
		return "object"
	}
	return "array"
}

// rawList parses a list of JSON values into one array value.
func rawList(raws []json.RawMessage) (pyValue, error) {
	list := pyValue{kind: pyArray}
	for i, raw := range raws {
		v, err := parsePyJSON(string(raw))
		if err != nil {
			return list, fmt.Errorf("[%d]: %v", i, err)
		}
		list.items = append(list.items, v)
	}
	return list, nil
}

// pyStrip is Python's str.strip(): leading and trailing whitespace as
// str.isspace defines it.
func pyStrip(s string) string {
	return strings.TrimFunc(s, pySpace)
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
