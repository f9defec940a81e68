package controlplane

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/tandem-inference/tandem/grammar"
)

// Protocol-level limits. They bound what a decoder accepts from anyone; the
// coordinator's admission control applies its own, usually smaller, limits
// (configured maximum prompt, what a decode group can hold).
const (
	MaxPromptTokens      = 1 << 20 // K3's max_position_embeddings
	MaxPromptBytes       = 8 << 20 // prompt text or chat content, in total
	MaxOutputTokens      = 1 << 20
	MaxChatMessages      = 4096
	MaxStops             = 32
	MaxStopTextBytes     = 256
	MaxIdempotencyKeyLen = 256
	MaxTemperature       = 100
	// MaxImages bounds the images of one submission or assignment; the
	// coordinator's own limit (images.max_per_request) is usually lower.
	MaxImages = 64
	// MaxParts bounds the content parts of one chat turn.
	MaxParts = 1024
)

// Policy says how the coordinator routes a job.
type Policy string

const (
	PolicyAuto   Policy = "auto"   // pick the smaller predicted time to first token (the default)
	PolicyLocal  Policy = "local"  // the decode group prefills the prompt itself
	PolicyRemote Policy = "remote" // the prefill worker prefills, the state is transferred
)

func (p Policy) valid() bool {
	return p == "" || p == PolicyAuto || p == PolicyLocal || p == PolicyRemote
}

// Sampling holds the generation parameters shared by a submission and the
// assignment the decode group gets. Zero values mean: max_tokens 0 = the
// coordinator's default; temperature 0 = greedy; top_p 0 or 1 and top_k 0 =
// no truncation.
type Sampling struct {
	MaxTokens   int     `msgpack:"max_tokens,omitempty" json:"max_tokens,omitempty"`
	Temperature float64 `msgpack:"temperature,omitempty" json:"temperature,omitempty"`
	TopP        float64 `msgpack:"top_p,omitempty" json:"top_p,omitempty"`
	TopK        int     `msgpack:"top_k,omitempty" json:"top_k,omitempty"`
	// Seed seeds the sampler: same seed and prompt, same tokens.
	Seed uint64 `msgpack:"seed,omitempty" json:"seed,omitempty"`
	Stop Stop   `msgpack:"stop,omitempty" json:"stop,omitzero"`
	// Reply, set by the coordinator on a chat job, has the decode group
	// read the tokens as K3's reply: token messages then carry the think
	// channel apart (Reasoning) and the calls (Call).
	Reply *ChatReply `msgpack:"reply,omitempty" json:"reply,omitempty"`
	// Grammar, when set, constrains the reply (tool_choice required or
	// named, response_format json): the decode group draws each token
	// within it and ends the reply when it is complete.
	Grammar *grammar.Spec `msgpack:"grammar,omitempty" json:"grammar,omitempty"`
	// NoDraft turns speculative decoding off for the job (the tokens are
	// the same either way; only their pace differs).
	NoDraft bool `msgpack:"no_draft,omitempty" json:"no_draft,omitempty"`
}

// ChatReply says how a chat job's reply opens: in the think channel when
// Thinking, and whether its tools element's calls are reported (Tools).
type ChatReply struct {
	Thinking bool `msgpack:"thinking,omitempty" json:"thinking,omitempty"`
	Tools    bool `msgpack:"tools,omitempty" json:"tools,omitempty"`
}

func (s *Sampling) validate(msg string) error {
	switch {
	case s.MaxTokens < 0:
		return fieldErr(msg, "max_tokens", "is %d, must be >= 0 (0 means the coordinator's default)", s.MaxTokens)
	case s.MaxTokens > MaxOutputTokens:
		return fieldErr(msg, "max_tokens", "is %d, at most %d allowed", s.MaxTokens, MaxOutputTokens)
	case math.IsNaN(s.Temperature) || math.IsInf(s.Temperature, 0):
		return fieldErr(msg, "temperature", "is %v, must be a finite number", s.Temperature)
	case s.Temperature < 0 || s.Temperature > MaxTemperature:
		return fieldErr(msg, "temperature", "is %v, must be in [0, %d] (0 means greedy)", s.Temperature, MaxTemperature)
	case math.IsNaN(s.TopP) || s.TopP < 0 || s.TopP > 1:
		return fieldErr(msg, "top_p", "is %v, must be in [0, 1]", s.TopP)
	case s.TopK < 0:
		return fieldErr(msg, "top_k", "is %d, must be >= 0 (0 means no limit)", s.TopK)
	}
	if s.Grammar != nil {
		if err := s.Grammar.Validate(); err != nil {
			return fieldErr(msg, "grammar", "%v", err)
		}
	}
	return s.Stop.validate(msg)
}

// ChatMessage is one turn of a chat-form prompt; the coordinator renders
// the turns in K3's conversation format (docs/API.md).
type ChatMessage struct {
	Role    string `msgpack:"role" json:"role"`
	Content string `msgpack:"content" json:"content"`
	// Parts, instead of Content, give a turn of text and images in order
	// (OpenAI's content parts): the i-th image part of the whole chat is
	// the submission's Images[i].
	Parts []ContentPart `msgpack:"parts,omitempty" json:"parts,omitempty"`
	Name  string        `msgpack:"name,omitempty" json:"name,omitempty"`
	// ReasoningContent is an assistant turn's thinking.
	ReasoningContent string `msgpack:"reasoning_content,omitempty" json:"reasoning_content,omitempty"`
	// ToolCalls are the calls an assistant turn made (after its content).
	ToolCalls []ToolCall `msgpack:"tool_calls,omitempty" json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool turn answers; Tool names its function
	// (one of them is required on tool turns).
	ToolCallID string `msgpack:"tool_call_id,omitempty" json:"tool_call_id,omitempty"`
	Tool       string `msgpack:"tool,omitempty" json:"tool,omitempty"`
}

// ContentPart is one part of a turn's content: {"type": "text", "text":
// ...} or {"type": "image"} (the next of the submission's images).
type ContentPart struct {
	Type string `msgpack:"type" json:"type"`
	Text string `msgpack:"text,omitempty" json:"text,omitempty"`
}

// Part types.
const (
	PartText  = "text"
	PartImage = "image"
)

// ToolCall is one function call of an assistant turn: the call's id (the
// tool turn that answers it names it), the function and its arguments as
// the model wrote them (JSON by convention).
type ToolCall struct {
	ID        string `msgpack:"id" json:"id"`
	Name      string `msgpack:"name" json:"name"`
	Arguments string `msgpack:"arguments" json:"arguments"`
}

// MaxToolCalls bounds the calls of one assistant turn; MaxToolsBytes the
// tool declarations of a submission.
const (
	MaxToolCalls  = 128
	MaxToolsBytes = 1 << 20
)

var chatRoles = map[string]bool{"system": true, "user": true, "assistant": true, "tool": true}

// SubmitRequest asks for one generation. Exactly one of TokenIDs, Prompt and
// Messages gives the prompt.
type SubmitRequest struct {
	TokenIDs []int32       `msgpack:"token_ids,omitempty" json:"token_ids,omitempty"`
	Prompt   string        `msgpack:"prompt,omitempty" json:"prompt,omitempty"`
	Messages []ChatMessage `msgpack:"messages,omitempty" json:"messages,omitempty"`
	// Tools declares the functions the model may call in a chat: a JSON
	// array of OpenAI tool objects ({"type": "function", "function":
	// {name, description, parameters}}) or of the functions themselves;
	// only with messages.
	Tools string `msgpack:"tools,omitempty" json:"tools,omitempty"`
	// ReasoningEffort, ToolChoice and ResponseFormat are OpenAI's chat
	// parameters, with messages only: reasoning_effort "none" turns K3's
	// thinking off; tool_choice is "auto", "none", "required" or the name
	// of the one function to call; response_format is OpenAI's object, as
	// JSON text. ThinkingBudget bounds the thinking before a required
	// call or JSON reply (0: the default, half of max_tokens).
	ReasoningEffort string `msgpack:"reasoning_effort,omitempty" json:"reasoning_effort,omitempty"`
	ToolChoice      string `msgpack:"tool_choice,omitempty" json:"tool_choice,omitempty"`
	ResponseFormat  string `msgpack:"response_format,omitempty" json:"response_format,omitempty"`
	ThinkingBudget  int    `msgpack:"thinking_budget,omitempty" json:"thinking_budget,omitempty"`
	// Images are the prompt's images, the encoded files as the user sent
	// them (PNG, JPEG, GIF or WebP; msgpack bin, base64 in JSON), in
	// prompt order: with messages, the i-th image part is Images[i]; with
	// token_ids, the i-th run of <|media_pad|> ids is (the coordinator
	// checks that each run is as long as its image's feature rows). Not
	// with a text prompt.
	Images   [][]byte `msgpack:"images,omitempty" json:"images,omitempty"`
	Sampling `msgpack:",inline"`
	// IdempotencyKey makes a submission safe to retry: every submission
	// with the same key within the queue's duplicate window runs once and
	// is answered with the same job id.
	IdempotencyKey string `msgpack:"idempotency_key,omitempty" json:"idempotency_key,omitempty"`
	Policy         Policy `msgpack:"policy,omitempty" json:"policy,omitempty"`
}

// Validate checks the request on its own (not against a model or the
// coordinator's limits) and says which field is wrong.
func (r *SubmitRequest) Validate() error {
	const msg = "SubmitRequest"
	given := 0
	if len(r.TokenIDs) > 0 {
		given++
	}
	if r.Prompt != "" {
		given++
	}
	if len(r.Messages) > 0 {
		given++
	}
	switch {
	case given == 0:
		return fieldErr(msg, "", "empty prompt: give token_ids, prompt or messages")
	case given > 1:
		return fieldErr(msg, "", "give only one of token_ids, prompt and messages")
	}
	if len(r.TokenIDs) > MaxPromptTokens {
		return fieldErr(msg, "token_ids", "has %d tokens, at most %d allowed", len(r.TokenIDs), MaxPromptTokens)
	}
	for i, id := range r.TokenIDs {
		if id < 0 {
			return fieldErr(msg, fmt.Sprintf("token_ids[%d]", i), "is %d, token ids are >= 0", id)
		}
	}
	if err := checkText(msg, "prompt", r.Prompt, MaxPromptBytes); err != nil {
		return err
	}
	if err := validateChat(msg, r.Messages); err != nil {
		return err
	}
	if err := checkImages(msg, r.Images); err != nil {
		return err
	}
	if len(r.Images) > 0 && r.Prompt != "" {
		return fieldErr(msg, "images", "are given with a text prompt: images go in messages (image parts) or with token_ids (one <|media_pad|> run each)")
	}
	if n := imageParts(r.Messages); len(r.Messages) > 0 && n != len(r.Images) {
		return fieldErr(msg, "images", "has %d images for %d image parts in messages: give one image per part, in order", len(r.Images), n)
	}
	if r.Tools != "" {
		if len(r.Messages) == 0 {
			return fieldErr(msg, "tools", "is given without messages: tools are declared in a chat")
		}
		if err := checkText(msg, "tools", r.Tools, MaxToolsBytes); err != nil {
			return err
		}
		var decls []json.RawMessage
		if err := json.Unmarshal([]byte(r.Tools), &decls); err != nil {
			return fieldErr(msg, "tools", "is not a JSON array of function declarations: %v", err)
		}
	}
	if len(r.Messages) == 0 && (r.ReasoningEffort != "" || r.ToolChoice != "" || r.ResponseFormat != "" || r.ThinkingBudget != 0) {
		return fieldErr(msg, "messages", "reasoning_effort, tool_choice, response_format and thinking_budget need messages")
	}
	for _, f := range []struct{ name, v string }{{"reasoning_effort", r.ReasoningEffort}, {"tool_choice", r.ToolChoice}} {
		if err := checkText(msg, f.name, f.v, 256); err != nil {
			return err
		}
	}
	if err := checkText(msg, "response_format", r.ResponseFormat, MaxToolsBytes); err != nil {
		return err
	}
	if r.ResponseFormat != "" && !json.Valid([]byte(r.ResponseFormat)) {
		return fieldErr(msg, "response_format", "is not JSON")
	}
	if r.ThinkingBudget < 0 || r.ThinkingBudget > MaxOutputTokens {
		return fieldErr(msg, "thinking_budget", "is %d, must be in [0, %d]", r.ThinkingBudget, MaxOutputTokens)
	}
	if err := r.Sampling.validate(msg); err != nil {
		return err
	}
	if err := checkIdempotencyKey(msg, r.IdempotencyKey); err != nil {
		return err
	}
	if !r.Policy.valid() {
		return fieldErr(msg, "policy", "is %q, must be auto, local or remote", r.Policy)
	}
	return nil
}

func validateChat(msg string, turns []ChatMessage) error {
	if len(turns) > MaxChatMessages {
		return fieldErr(msg, "messages", "has %d turns, at most %d allowed", len(turns), MaxChatMessages)
	}
	total, content := 0, false
	for i, m := range turns {
		field := fmt.Sprintf("messages[%d]", i)
		if !chatRoles[m.Role] {
			return fieldErr(msg, field+".role", "is %q, must be system, user, assistant or tool", m.Role)
		}
		if !utf8.ValidString(m.Content) {
			return fieldErr(msg, field+".content", "is not valid UTF-8")
		}
		if len(m.Name) > 256 || !utf8.ValidString(m.Name) {
			return fieldErr(msg, field+".name", "must be valid UTF-8 of at most 256 bytes")
		}
		switch {
		case m.Role == "tool" && m.ToolCallID == "" && m.Tool == "":
			return fieldErr(msg, field+".tool_call_id", "is missing: a tool turn names the call it answers (or its function, in tool)")
		case m.Role != "tool" && m.Tool != "":
			return fieldErr(msg, field+".tool", "is given on a %s turn; only tool turns name a function", m.Role)
		case m.Role != "assistant" && m.ReasoningContent != "":
			return fieldErr(msg, field+".reasoning_content", "is given on a %s turn; only assistant turns think", m.Role)
		case len(m.Tool) > 256 || !utf8.ValidString(m.Tool) || !utf8.ValidString(m.ReasoningContent):
			return fieldErr(msg, field, "tool and reasoning_content must be valid UTF-8 (tool at most 256 bytes)")
		case m.Role != "tool" && m.ToolCallID != "":
			return fieldErr(msg, field+".tool_call_id", "is given on a %s turn; only tool turns answer a call", m.Role)
		case len(m.ToolCallID) > 256 || !utf8.ValidString(m.ToolCallID):
			return fieldErr(msg, field+".tool_call_id", "must be valid UTF-8 of at most 256 bytes")
		case len(m.ToolCalls) > 0 && m.Role != "assistant":
			return fieldErr(msg, field+".tool_calls", "are given on a %s turn; only assistant turns make calls", m.Role)
		case len(m.ToolCalls) > MaxToolCalls:
			return fieldErr(msg, field+".tool_calls", "has %d calls, at most %d allowed", len(m.ToolCalls), MaxToolCalls)
		}
		for j, c := range m.ToolCalls {
			cf := fmt.Sprintf("%s.tool_calls[%d]", field, j)
			switch {
			case c.Name == "" || len(c.Name) > 256 || !utf8.ValidString(c.Name):
				return fieldErr(msg, cf+".name", "must be 1 to 256 bytes of UTF-8")
			case len(c.ID) > 256 || !utf8.ValidString(c.ID):
				return fieldErr(msg, cf+".id", "must be valid UTF-8 of at most 256 bytes")
			case !utf8.ValidString(c.Arguments):
				return fieldErr(msg, cf+".arguments", "is not valid UTF-8")
			}
			total += len(c.Arguments)
		}
		n, err := checkParts(msg, field, &m)
		if err != nil {
			return err
		}
		total += len(m.Content) + len(m.ReasoningContent) + n
		content = content || strings.TrimSpace(m.Content) != "" || len(m.Parts) > 0
	}
	if total > MaxPromptBytes {
		return fieldErr(msg, "messages", "hold %d bytes of content, at most %d allowed", total, MaxPromptBytes)
	}
	if len(turns) > 0 && !content {
		return fieldErr(msg, "messages", "empty prompt: every turn's content is empty")
	}
	return nil
}

// checkParts checks a turn's content parts and returns their text bytes.
func checkParts(msg, field string, m *ChatMessage) (int, error) {
	if len(m.Parts) == 0 {
		return 0, nil
	}
	switch {
	case m.Content != "":
		return 0, fieldErr(msg, field+".parts", "are given with content: give one of them")
	case len(m.Parts) > MaxParts:
		return 0, fieldErr(msg, field+".parts", "has %d parts, at most %d allowed", len(m.Parts), MaxParts)
	}
	n := 0
	for j, p := range m.Parts {
		pf := fmt.Sprintf("%s.parts[%d]", field, j)
		switch {
		case p.Type == PartImage && p.Text != "":
			return 0, fieldErr(msg, pf+".text", "is given on an image part")
		case p.Type != PartText && p.Type != PartImage:
			return 0, fieldErr(msg, pf+".type", "is %q, must be text or image", p.Type)
		case !utf8.ValidString(p.Text):
			return 0, fieldErr(msg, pf+".text", "is not valid UTF-8")
		}
		n += len(p.Text)
	}
	return n, nil
}

// imageParts counts the image parts of a chat.
func imageParts(turns []ChatMessage) int {
	n := 0
	for _, m := range turns {
		for _, p := range m.Parts {
			if p.Type == PartImage {
				n++
			}
		}
	}
	return n
}

// checkImages bounds a message's images: their number, and no empty one
// (the message size bounds their bytes).
func checkImages(msg string, images [][]byte) error {
	if len(images) > MaxImages {
		return fieldErr(msg, "images", "has %d images, at most %d allowed", len(images), MaxImages)
	}
	for i, im := range images {
		if len(im) == 0 {
			return fieldErr(msg, fmt.Sprintf("images[%d]", i), "is empty: want the encoded image file")
		}
	}
	return nil
}

func checkText(msg, field, s string, max int) error {
	if len(s) > max {
		return fieldErr(msg, field, "is %d bytes, at most %d allowed", len(s), max)
	}
	if !utf8.ValidString(s) {
		return fieldErr(msg, field, "is not valid UTF-8")
	}
	return nil
}

// checkIdempotencyKey keeps keys printable: the key travels as the
// Nats-Msg-Id header, where a control character would break the header block.
func checkIdempotencyKey(msg, key string) error {
	if len(key) > MaxIdempotencyKeyLen {
		return fieldErr(msg, "idempotency_key", "is %d bytes, at most %d allowed", len(key), MaxIdempotencyKeyLen)
	}
	if !utf8.ValidString(key) {
		return fieldErr(msg, "idempotency_key", "is not valid UTF-8")
	}
	for i, c := range key {
		if c < 0x20 || c == 0x7f {
			return fieldErr(msg, "idempotency_key", "has control character %U at byte %d", c, i)
		}
	}
	return nil
}

// SubmitReply answers a SubmitRequest: JobID on success, Error (and Code)
// otherwise.
type SubmitReply struct {
	JobID string `msgpack:"job_id,omitempty" json:"job_id,omitempty"`
	// Duplicate is set when the idempotency key matched an earlier
	// submission: JobID is that job, and nothing new was queued.
	Duplicate bool      `msgpack:"duplicate,omitempty" json:"duplicate,omitempty"`
	Error     string    `msgpack:"error,omitempty" json:"error,omitempty"`
	Code      ErrorCode `msgpack:"code,omitempty" json:"code,omitempty"`
}

// Validate checks that the reply carries exactly one of a job id and an error.
func (r *SubmitReply) Validate() error {
	const msg = "SubmitReply"
	if err := checkReply(msg, r.Error, r.Code); err != nil {
		return err
	}
	switch {
	case r.JobID == "" && r.Error == "":
		return fieldErr(msg, "", "has neither job_id nor error")
	case r.JobID != "" && r.Error != "":
		return fieldErr(msg, "", "has both job_id and error")
	case r.JobID != "":
		if err := CheckID(r.JobID); err != nil {
			return fieldErr(msg, "job_id", "%v", err)
		}
	}
	return nil
}

// Err returns the reply's error as a *RemoteError, or nil.
func (r *SubmitReply) Err() error { return replyErr(r.Error, r.Code) }

func checkReply(msg, text string, code ErrorCode) error {
	if !code.valid() {
		return fieldErr(msg, "code", "is %q, not a known error code", code)
	}
	if code != "" && text == "" {
		return fieldErr(msg, "error", "is empty but code is %q", code)
	}
	return nil
}

func replyErr(text string, code ErrorCode) error {
	if text == "" {
		return nil
	}
	return &RemoteError{Code: code, Message: text}
}
