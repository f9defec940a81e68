package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strings"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/tokenizer"
)

// plan is a request made into a job: the prompt as token ids (framed by
// the front door, so that tools and tool turns use the model's syntax and
// the prompt's length is known before anything is queued), the sampling,
// and how to read the reply.
type plan struct {
	chat         bool
	prompt       []int32
	images       [][]byte // the prompt's images, in order (chat only)
	sampling     cp.Sampling
	reply        tokenizer.ReplyOptions // chat: how the reply is read
	stops        []string               // stop texts, applied to the text here too
	stream       bool
	includeUsage bool
	user         string
}

// planner turns requests into plans: pure, with the model and the limits.
type planner struct {
	name      string // the served model's name
	info      *modelinfo.Info
	tok       *tokenizer.Tokenizer
	maxPrompt int           // longest prompt in tokens
	images    images.Limits // a request's images
}

// OpenAI's limits: function names, stop strings.
var funcName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

const maxStopTexts = 4

// Defaults OpenAI documents for parameters a request leaves out.
const (
	defaultTemperature         = 1.0
	defaultCompletionMaxTokens = 16
	maxTemperature             = 2.0
)

func (p *planner) checkModel(model string) *apiError {
	if model == "" {
		return badRequest("model", "model is required (this server serves %q)", p.name)
	}
	if model != p.name && model != p.info.ID {
		return newErr(404, "invalid_request_error", "model_not_found", "model",
			"the model %q does not exist here; this server serves %q", model, p.name)
	}
	return nil
}

// sampling checks the parameters both endpoints share.
func sampling(maxTokens *int, temperature, topP *float64, seed *int64, n *int, stop stopField) (cp.Sampling, *apiError) {
	var s cp.Sampling
	if n != nil && *n != 1 {
		return s, badRequest("n", "n is %d: this server generates one choice per request (n = 1)", *n)
	}
	if maxTokens != nil {
		if *maxTokens < 1 || *maxTokens > cp.MaxOutputTokens {
			return s, badRequest("max_tokens", "max_tokens is %d, must be in [1, %d]", *maxTokens, cp.MaxOutputTokens)
		}
		s.MaxTokens = *maxTokens
	}
	s.Temperature = defaultTemperature
	if temperature != nil {
		t := *temperature
		if math.IsNaN(t) || t < 0 || t > maxTemperature {
			return s, badRequest("temperature", "temperature is %v, must be in [0, 2]", t)
		}
		s.Temperature = t
	}
	if topP != nil {
		t := *topP
		if math.IsNaN(t) || t <= 0 || t > 1 {
			return s, badRequest("top_p", "top_p is %v, must be in (0, 1]", t)
		}
		s.TopP = t
	}
	if seed != nil {
		s.Seed = uint64(*seed) // any 64-bit seed; its bits seed the sampler
	}
	if len(stop) > maxStopTexts {
		return s, badRequest("stop", "stop has %d strings, at most %d allowed", len(stop), maxStopTexts)
	}
	for i, st := range stop {
		if st == "" || len(st) > cp.MaxStopTextBytes {
			return s, badRequest("stop", "stop[%d] must be 1 to %d bytes", i, cp.MaxStopTextBytes)
		}
	}
	s.Stop.Texts = stop
	return s, nil
}

// chat plans a chat completion: the request rendered in K3's released
// conversation format (tokenizer.RenderChat), the grammar its reply must
// follow, and how to read the reply. imgs are the request's images, read
// from its image_url parts in order (imageRefs, readImages).
func (p *planner) chat(req *chatRequest, imgs [][]byte) (*plan, *apiError) {
	if err := p.checkModel(req.Model); err != nil {
		return nil, err
	}
	if p.tok == nil {
		return nil, badRequest("messages", "model %s has no tokenizer: use /v1/completions with token ids", p.name)
	}
	if req.Logprobs {
		return nil, badRequest("logprobs", "logprobs are not supported")
	}
	limit := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		limit = req.MaxCompletionTokens
	}
	s, aerr := sampling(limit, req.Temperature, req.TopP, req.Seed, req.N, req.Stop)
	if aerr != nil {
		return nil, aerr
	}
	s.NoDraft = req.Draft != nil && !*req.Draft
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages is empty")
	}
	if len(req.Messages) > cp.MaxChatMessages {
		return nil, badRequest("messages", "messages has %d turns, at most %d allowed", len(req.Messages), cp.MaxChatMessages)
	}
	pl := &plan{chat: true, sampling: s, stops: req.Stop, stream: req.Stream, user: req.User,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	c := &tokenizer.Chat{Messages: make([]tokenizer.ChatMessage, len(req.Messages)), Tools: req.Tools,
		ToolChoice: req.ToolChoice, ResponseFormat: req.ResponseFormat, ReasoningEffort: req.ReasoningEffort}
	for i := range req.Messages {
		m, aerr := message(i, req.Messages[i])
		if aerr != nil {
			return nil, aerr
		}
		c.Messages[i] = m
	}
	names, aerr := tools(req.Tools)
	if aerr != nil {
		return nil, aerr
	}
	if aerr := toolChoice(req.ToolChoice, names); aerr != nil {
		return nil, aerr
	}
	if aerr := responseFormat(c); aerr != nil {
		return nil, aerr
	}
	var err error
	if _, _, err := tokenizer.Thinking(req.ReasoningEffort); err != nil {
		return nil, badRequest("reasoning_effort", "%s", strings.TrimPrefix(err.Error(), tokenizer.ErrChat.Error()+": "))
	}
	if pl.reply, err = c.Reply(); err != nil {
		return nil, badRequest("messages", "%v", err)
	}
	budget, aerr := thinkingBudget(req.ThinkingBudget, s.MaxTokens)
	if aerr != nil {
		return nil, aerr
	}
	if pl.sampling.Grammar, err = c.Constraint(budget); err != nil {
		return nil, badRequest(constraintParam(c), "%s", strings.TrimPrefix(err.Error(), tokenizer.ErrChat.Error()+": "))
	}
	if g := pl.sampling.Grammar; g != nil {
		// The decode group compiles it again (cached there); compiled
		// here, a schema it cannot hold is the client's 400, not a
		// failed job.
		if _, err := grammar.Compile(g); err != nil {
			return nil, badRequest(constraintParam(c), "%v", err)
		}
	}
	refs, aerr := p.imageRefs(req)
	if aerr != nil {
		return nil, aerr
	}
	if len(refs) != len(imgs) {
		return nil, badRequest("messages", "%d images read for %d image_url parts", len(imgs), len(refs))
	}
	if len(imgs) > 0 {
		// Each image is decoded once here, within the limits: a damaged
		// file is the client's 400 now, not a failed job later.
		if c.Images, err = p.images.Sizes(imgs, true); err != nil {
			return nil, imageErr(refs, err)
		}
		pl.images = imgs
	}
	segs, err := tokenizer.RenderChat(c)
	if err != nil {
		return nil, badRequest("messages", "%s", strings.TrimPrefix(err.Error(), tokenizer.ErrChat.Error()+": "))
	}
	if aerr := p.surelyFits(p.tok.MinSegmentTokens(segs), s.MaxTokens, "messages"); aerr != nil {
		return nil, aerr
	}
	ids, err := p.tok.EncodeChat(c)
	if err != nil {
		return nil, badRequest("messages", "%s", strings.TrimPrefix(err.Error(), tokenizer.ErrChat.Error()+": "))
	}
	// The turn ends at <|end_of_msg|>.
	if eom := p.tok.EndOfMessageID(); eom >= 0 {
		pl.sampling.Stop.TokenIDs = []int32{int32(eom)}
	}
	if aerr := p.fit(ids, pl.sampling.MaxTokens, "messages"); aerr != nil {
		return nil, aerr
	}
	pl.prompt = toInt32(ids)
	return pl, nil
}

// constraintParam names the request field a constraint's error is about.
func constraintParam(c *tokenizer.Chat) string {
	if rf := c.ResponseFormatType(); rf == "json_schema" || rf == "json_object" {
		return "response_format"
	}
	return "tools"
}

// defaultThinkingBudget bounds the thinking of a reply held to a grammar
// when the request sets neither thinking_budget nor max_tokens.
const defaultThinkingBudget = 4096

// thinkingBudget is the think channel's bound for a constrained reply:
// thinking_budget, else half of max_tokens, else defaultThinkingBudget;
// so that the call or the JSON still comes within max_tokens.
func thinkingBudget(given *int, maxTokens int) (int, *apiError) {
	switch {
	case given != nil && (*given < 1 || *given > cp.MaxOutputTokens):
		return 0, badRequest("thinking_budget", "thinking_budget is %d, must be in [1, %d] (no thinking at all: reasoning_effort none)", *given, cp.MaxOutputTokens)
	case given != nil:
		return *given, nil
	case maxTokens > 0:
		return max(1, maxTokens/2), nil
	}
	return defaultThinkingBudget, nil
}

// message checks one chat message and adjusts it to K3's renderer: a
// developer message becomes a system message (OpenAI's newer name for it,
// which the released renderer would drop).
func message(i int, m tokenizer.ChatMessage) (tokenizer.ChatMessage, *apiError) {
	param := fmt.Sprintf("messages[%d]", i)
	if m.Role == "developer" {
		m.Role = "system"
	}
	switch m.Role {
	case "system", "user", "assistant", "tool":
	default:
		return m, badRequest(param+".role", "role %q: want system, developer, user, assistant or tool", m.Role)
	}
	if err := contentText(m.Content); err != nil {
		return m, badRequest(param+".content", "%s", err)
	}
	if m.Role != "assistant" && len(m.ToolCalls) > 0 {
		return m, badRequest(param+".tool_calls", "only assistant messages carry tool calls")
	}
	if m.Role != "assistant" && (m.ReasoningContent != "" || m.Reasoning != "") {
		return m, badRequest(param+".reasoning_content", "only assistant messages carry reasoning")
	}
	if m.Role == "tool" && m.ToolCallID == "" && m.Tool == "" && m.Name == "" {
		return m, badRequest(param+".tool_call_id", "a tool message needs the tool_call_id it answers")
	}
	for j, c := range m.ToolCalls {
		cparam := fmt.Sprintf("%s.tool_calls[%d]", param, j)
		if c.Type != "" && c.Type != "function" {
			return m, badRequest(cparam+".type", "tool call type %q is not supported (only function)", c.Type)
		}
		if !funcName.MatchString(c.Function.Name) {
			return m, badRequest(cparam+".function.name", "function name %q must be 1 to 64 of a-z, A-Z, 0-9, _ and -", c.Function.Name)
		}
	}
	return m, nil
}

// contentText checks a message's content: a string, null, or an array of
// text and image_url parts.
func contentText(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) || raw[0] == '"' {
		var s *string
		if len(raw) > 0 && json.Unmarshal(raw, &s) != nil {
			return fmt.Errorf("content is not a valid JSON string")
		}
		return nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return fmt.Errorf("content must be a string or an array of text and image_url parts")
	}
	for j, part := range parts {
		switch part.Type {
		case "text":
		case "image_url":
			if _, err := partURL(part); err != nil {
				return fmt.Errorf("content[%d].image_url: %v", j, err)
			}
		default:
			return fmt.Errorf("content[%d] is of type %q: this model reads text and image_url parts", j, part.Type)
		}
	}
	return nil
}

// partURL reads an image_url part's URL: {"url": ..., "detail": ...}, or
// the URL string itself as some clients send it.
func partURL(p contentPart) (string, error) {
	raw := bytes.TrimSpace(p.ImageURL)
	if len(raw) > 0 && raw[0] == '"' {
		var u string
		if err := json.Unmarshal(raw, &u); err != nil {
			return "", err
		}
		return u, nil
	}
	var iu imageURL
	if len(raw) == 0 || json.Unmarshal(raw, &iu) != nil || iu.URL == "" {
		return "", fmt.Errorf(`want {"url": "data:image/png;base64,..."}`)
	}
	switch iu.Detail {
	case "", "auto", "low", "high":
	default:
		return "", fmt.Errorf("detail %q: want auto, low or high", iu.Detail)
	}
	return iu.URL, nil
}

// tools checks the tool declarations and returns the functions' names.
func tools(raws []json.RawMessage) (map[string]bool, *apiError) {
	names := map[string]bool{}
	for i, raw := range raws {
		param := fmt.Sprintf("tools[%d]", i)
		var t struct {
			Type     string   `json:"type"`
			Function function `json:"function"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, badRequest(param, "a tool must be {\"type\": \"function\", \"function\": {...}}: %v", err)
		}
		if t.Type != "function" {
			return nil, badRequest(param+".type", "tool type %q is not supported (only function)", t.Type)
		}
		if !funcName.MatchString(t.Function.Name) {
			return nil, badRequest(param+".function.name", "function name %q must be 1 to 64 of a-z, A-Z, 0-9, _ and -", t.Function.Name)
		}
		if names[t.Function.Name] {
			return nil, badRequest(param+".function.name", "function %q is declared twice", t.Function.Name)
		}
		names[t.Function.Name] = true
	}
	return names, nil
}

// toolChoice checks tool_choice: "none", "auto", "required" or a named
// function.
func toolChoice(raw json.RawMessage, names map[string]bool) *apiError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	if raw[0] == '"' {
		var mode string
		if err := json.Unmarshal(raw, &mode); err != nil {
			return badRequest("tool_choice", "tool_choice: %v", err)
		}
		switch mode {
		case "none", "auto":
			return nil
		case "required":
			if len(names) == 0 {
				return badRequest("tool_choice", "tool_choice %q needs tools", mode)
			}
			return nil
		}
		return badRequest("tool_choice", "tool_choice %q: want none, auto, required or a function", mode)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" {
		return badRequest("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}`)
	}
	if !names[named.Function.Name] {
		return badRequest("tool_choice", "tool_choice names function %q, which tools does not declare", named.Function.Name)
	}
	return nil
}

// responseFormat checks response_format: text, json_object, or
// json_schema with a schema.
func responseFormat(c *tokenizer.Chat) *apiError {
	if len(bytes.TrimSpace(c.ResponseFormat)) == 0 || bytes.Equal(bytes.TrimSpace(c.ResponseFormat), []byte("null")) {
		return nil
	}
	var rf struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(c.ResponseFormat, &rf); err != nil {
		return badRequest("response_format", `response_format must be {"type": "text" | "json_object" | "json_schema", ...}`)
	}
	switch rf.Type {
	case "text", "json_object":
	case "json_schema":
		if c.ResponseSchema() == nil {
			return badRequest("response_format.json_schema.schema", "response_format json_schema needs json_schema.schema")
		}
	default:
		return badRequest("response_format.type", "response_format type %q: want text, json_object or json_schema", rf.Type)
	}
	return nil
}

// completion plans a text completion.
func (p *planner) completion(req *completionRequest) (*plan, *apiError) {
	if err := p.checkModel(req.Model); err != nil {
		return nil, err
	}
	switch {
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported")
	case req.Suffix != nil && *req.Suffix != "":
		return nil, badRequest("suffix", "suffix is not supported")
	case req.Logprobs != nil:
		return nil, badRequest("logprobs", "logprobs are not supported")
	case req.BestOf != nil && *req.BestOf != 1:
		return nil, badRequest("best_of", "best_of must be 1")
	}
	limit := req.MaxTokens
	if limit == nil {
		d := defaultCompletionMaxTokens
		limit = &d
	}
	s, aerr := sampling(limit, req.Temperature, req.TopP, req.Seed, req.N, req.Stop)
	if aerr != nil {
		return nil, aerr
	}
	s.NoDraft = req.Draft != nil && !*req.Draft
	ids, aerr := p.promptIDs(req.Prompt)
	if aerr != nil {
		return nil, aerr
	}
	if len(s.Stop.Texts) > 0 && p.tok == nil {
		return nil, badRequest("stop", "model %s has no tokenizer: stop strings cannot be matched", p.name)
	}
	if aerr := p.fit(ids, s.MaxTokens, "prompt"); aerr != nil {
		return nil, aerr
	}
	return &plan{prompt: toInt32(ids), sampling: s, stops: req.Stop, stream: req.Stream, user: req.User,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage}, nil
}

// promptIDs reads a completion prompt: a string, an array of one string,
// an array of token ids, or an array of one such array.
func (p *planner) promptIDs(raw json.RawMessage) ([]int, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("prompt", "prompt is required")
	}
	var text string
	var ids []int
	var texts []string
	var batches [][]int
	switch {
	case json.Unmarshal(raw, &text) == nil:
	case json.Unmarshal(raw, &ids) == nil:
	case json.Unmarshal(raw, &texts) == nil:
		if len(texts) != 1 {
			return nil, badRequest("prompt", "prompt holds %d prompts: this server takes one per request", len(texts))
		}
		text = texts[0]
	case json.Unmarshal(raw, &batches) == nil:
		if len(batches) != 1 {
			return nil, badRequest("prompt", "prompt holds %d prompts: this server takes one per request", len(batches))
		}
		ids = batches[0]
	default:
		return nil, badRequest("prompt", "prompt must be a string, token ids, or an array of one of them")
	}
	if ids == nil {
		if p.tok == nil {
			return nil, badRequest("prompt", "model %s has no tokenizer: give the prompt as token ids", p.name)
		}
		// The limit is checked again on the ids (in fit); before encoding,
		// only what is surely over it is refused.
		if aerr := p.surelyFits(p.tok.MinTokens(len(text)), 0, "prompt"); aerr != nil {
			return nil, aerr
		}
		ids = p.tok.Encode(text)
	}
	if len(ids) == 0 {
		return nil, badRequest("prompt", "empty prompt")
	}
	for i, id := range ids {
		if id < 0 || id >= p.info.VocabSize {
			return nil, badRequest("prompt", "prompt[%d] is token %d, outside the model's vocabulary [0, %d)", i, id, p.info.VocabSize)
		}
	}
	return ids, nil
}

// fit checks the prompt against the limits: the configured longest
// prompt, and prompt + output against the model's positions.
func (p *planner) fit(ids []int, maxTokens int, param string) *apiError {
	return p.limits(len(ids), maxTokens, param, "")
}

// surelyFits refuses, before encoding, a prompt of at least atLeast
// tokens that is over the limits: a large body costs no encoding.
func (p *planner) surelyFits(atLeast, maxTokens int, param string) *apiError {
	return p.limits(atLeast, maxTokens, param, "at least ")
}

func (p *planner) limits(n, maxTokens int, param, atLeast string) *apiError {
	if p.maxPrompt > 0 && n > p.maxPrompt {
		return tooLong(param, "the prompt has %s%d tokens, at most %d allowed", atLeast, n, p.maxPrompt)
	}
	if m := p.info.MaxPositions; m > 0 && n+maxTokens > m {
		return tooLong(param, "the prompt (%s%d tokens) and max_tokens (%d) exceed the model's context length of %d tokens", atLeast, n, maxTokens, m)
	}
	return nil
}

func toInt32(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}
