package grammar

import (
	"encoding/json"
	"fmt"
)

// Mode names what a Spec constrains.
type Mode string

const (
	// ModeToolCall: the reply's response channel is empty and its tools
	// element holds one or more calls of declared tools (of Tool only,
	// when set), each argument typed and valued by the tool's parameters
	// schema.
	ModeToolCall Mode = "tool_call"
	// ModeJSONSchema: the response channel holds JSON that validates
	// against Schema, and the reply has no tools element.
	ModeJSONSchema Mode = "json_schema"
	// ModeJSONObject: the response channel holds a JSON object.
	ModeJSONObject Mode = "json_object"
)

// Spec is what a reply must be. It travels with a job's sampling
// parameters from the front door to the decode group's sampling rank, so
// it holds only plain data.
type Spec struct {
	Mode Mode `msgpack:"mode" json:"mode"`
	// Thinking says the reply opens in the think channel (the generation
	// prompt ended with <|open|>think<|sep|>); otherwise it opens in the
	// response channel.
	Thinking bool `msgpack:"thinking,omitempty" json:"thinking,omitempty"`
	// ThinkBudget bounds the think channel in tokens: once it is spent the
	// only allowed continuation is the channel's close. 0: unbounded.
	ThinkBudget int `msgpack:"think_budget,omitempty" json:"think_budget,omitempty"`
	// Tools are the declared functions (ModeToolCall).
	Tools []Tool `msgpack:"tools,omitempty" json:"tools,omitempty"`
	// Tool, when set, is the only function the reply may call
	// (ModeToolCall with a named tool_choice).
	Tool string `msgpack:"tool,omitempty" json:"tool,omitempty"`
	// Schema is the JSON schema the response must satisfy
	// (ModeJSONSchema).
	Schema json.RawMessage `msgpack:"schema,omitempty" json:"schema,omitempty"`
}

// Tool is one declared function: its name and its parameters' JSON schema
// (null or absent: an object with any arguments).
type Tool struct {
	Name       string          `msgpack:"name" json:"name"`
	Parameters json.RawMessage `msgpack:"parameters,omitempty" json:"parameters,omitempty"`
}

// Limits on a Spec: it comes from a client's request.
const (
	MaxSpecBytes = 256 << 10 // schemas and tool parameters together
	MaxTools     = 128
)

// Validate checks the Spec's shape and sizes (Compile checks the schemas).
func (s *Spec) Validate() error {
	switch s.Mode {
	case ModeToolCall:
		if len(s.Tools) == 0 {
			return fmt.Errorf("grammar: mode %s needs tools", s.Mode)
		}
	case ModeJSONSchema:
		if len(s.Schema) == 0 {
			return fmt.Errorf("grammar: mode %s needs a schema", s.Mode)
		}
	case ModeJSONObject:
	default:
		return fmt.Errorf("grammar: mode %q (want %s, %s or %s)", s.Mode, ModeToolCall, ModeJSONSchema, ModeJSONObject)
	}
	if len(s.Tools) > MaxTools {
		return fmt.Errorf("grammar: %d tools, at most %d allowed", len(s.Tools), MaxTools)
	}
	if s.ThinkBudget < 0 {
		return fmt.Errorf("grammar: think budget %d is negative", s.ThinkBudget)
	}
	n := len(s.Schema)
	for i, t := range s.Tools {
		if t.Name == "" {
			return fmt.Errorf("grammar: tools[%d] has no name", i)
		}
		n += len(t.Name) + len(t.Parameters)
	}
	if n > MaxSpecBytes {
		return fmt.Errorf("grammar: the schemas hold %d bytes, at most %d allowed", n, MaxSpecBytes)
	}
	if s.Tool != "" {
		found := false
		for _, t := range s.Tools {
			found = found || t.Name == s.Tool
		}
		if !found {
			return fmt.Errorf("grammar: tool %q is not among the declared tools", s.Tool)
		}
	}
	return nil
}
