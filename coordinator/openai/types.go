package openai

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/tandem-inference/tandem/tokenizer"
)

// The wire types of the OpenAI API that tandem serves. Requests keep
// optional numbers as pointers, to tell "absent" from zero; unknown fields
// are ignored, as OpenAI-compatible servers do, except the ones whose
// meaning tandem cannot honour (checked in request.go).

type chatRequest struct {
	Model               string                  `json:"model"`
	Messages            []tokenizer.ChatMessage `json:"messages"`
	MaxTokens           *int                    `json:"max_tokens"`
	MaxCompletionTokens *int                    `json:"max_completion_tokens"`
	Temperature         *float64                `json:"temperature"`
	TopP                *float64                `json:"top_p"`
	Seed                *int64                  `json:"seed"`
	Stop                stopField               `json:"stop"`
	N                   *int                    `json:"n"`
	Stream              bool                    `json:"stream"`
	StreamOptions       *streamOptions          `json:"stream_options"`
	Tools               []json.RawMessage       `json:"tools"`
	ToolChoice          json.RawMessage         `json:"tool_choice"`
	User                string                  `json:"user"`
	Logprobs            bool                    `json:"logprobs"`
	ResponseFormat      json.RawMessage         `json:"response_format"`
	// ReasoningEffort is OpenAI's; none turns K3's thinking off.
	ReasoningEffort string `json:"reasoning_effort"`
	// ThinkingBudget (tandem's) bounds the think channel of a reply held
	// to a grammar, in tokens.
	ThinkingBudget *int `json:"thinking_budget"`
	// Draft (tandem's) false turns speculative decoding off for the
	// request (the tokens are the same either way).
	Draft *bool `json:"draft"`
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	Seed          *int64          `json:"seed"`
	Stop          stopField       `json:"stop"`
	N             *int            `json:"n"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	User          string          `json:"user"`
	Echo          bool            `json:"echo"`
	Suffix        *string         `json:"suffix"`
	Logprobs      *int            `json:"logprobs"`
	BestOf        *int            `json:"best_of"`
	Draft         *bool           `json:"draft"` // tandem's: false turns speculative decoding off
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type contentPart struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	ImageURL json.RawMessage `json:"image_url"`
}

// imageURL is an image_url part's object; detail (auto, low, high) is
// accepted and has no effect: K3's processor reads every image at its own
// scale rule.
type imageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail"`
}

type toolDef struct {
	Type     string   `json:"type"`
	Function function `json:"function"`
}

type function struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

type toolCall struct {
	Index    *int         `json:"index,omitempty"` // stream deltas only
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function callFunction `json:"function"`
}

type callFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// stopField is OpenAI's stop: null, a string or an array of strings.
type stopField []string

func (s *stopField) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*s = nil
		return nil
	case len(b) > 0 && b[0] == '"':
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = stopField{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("stop must be a string or an array of strings")
	}
	*s = many
	return nil
}

// Responses.

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
	Tandem  *tandemInfo  `json:"tandem,omitempty"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *respMessage `json:"message,omitempty"`
	Delta        *respMessage `json:"delta,omitempty"`
	FinishReason *string      `json:"finish_reason"`
	Logprobs     *struct{}    `json:"logprobs"`
}

type respMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
	// ReasoningContent is K3's think channel, under the name
	// OpenAI-compatible servers use.
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
}

// chatChunk is a streamed chunk: the same fields as a whole completion
// (Object "chat.completion.chunk"); its usage is null on every chunk but the
// last when the client asked for usage (OpenAI's shape).
type chatChunk = chatCompletion

type textCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
	Tandem  *tandemInfo  `json:"tandem,omitempty"`
}

type textChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	FinishReason *string   `json:"finish_reason"`
	Logprobs     *struct{} `json:"logprobs"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails, OpenAI's: the prompt tokens a prefix cache
	// held (not prefilled again).
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// tandemInfo is tandem's own account of the job, in a field strict
// clients ignore: how it was routed, both predicted times to first token,
// and where its time went (milliseconds).
type tandemInfo struct {
	JobID                string      `json:"job_id"`
	Route                string      `json:"route,omitempty"`
	Policy               string      `json:"policy,omitempty"`
	PrefillWorker        string      `json:"prefill_worker,omitempty"`
	DecodeGroup          string      `json:"decode_group,omitempty"`
	PredictedTTFTLocalMs float64     `json:"predicted_ttft_local_ms"`
	PredictedTTFTRemote  float64     `json:"predicted_ttft_remote_ms"`
	TTFTMs               float64     `json:"ttft_ms"`
	Timing               *timingInfo `json:"timing,omitempty"`
}

type timingInfo struct {
	QueueMs        float64 `json:"queue_ms"`
	PassWaitMs     float64 `json:"pass_wait_ms"`
	PrefillMs      float64 `json:"prefill_ms"`
	TransferTailMs float64 `json:"transfer_tail_ms"`
	FirstTokenMs   float64 `json:"first_token_ms"`
	DecodeMs       float64 `json:"decode_ms"`
	TotalMs        float64 `json:"total_ms"`
	DecodeTokPerS  float64 `json:"decode_tok_s"`
	// CachedTokens of the prompt came from the prefix cache of worker
	// CachedOn instead of being prefilled.
	CachedTokens int    `json:"cached_tokens,omitempty"`
	CachedOn     string `json:"cached_on,omitempty"`
	// Speculative decoding: the decode steps that emitted the tokens, the
	// tokens drafted and accepted, and the accepted ones per step.
	DecodeSteps     int     `json:"decode_steps,omitempty"`
	DraftedTokens   int     `json:"drafted_tokens,omitempty"`
	AcceptedTokens  int     `json:"accepted_tokens,omitempty"`
	AcceptedPerStep float64 `json:"accepted_per_step,omitempty"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID            string `json:"id"`
	Object        string `json:"object"`
	Created       int64  `json:"created"`
	OwnedBy       string `json:"owned_by"`
	ContextLength int    `json:"context_length"`
	MaxModelLen   int    `json:"max_model_len"`
}
