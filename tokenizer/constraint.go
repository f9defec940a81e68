package tokenizer

import (
	"encoding/json"
	"fmt"

	"github.com/tandem-inference/tandem/grammar"
)

// Reply returns how the reply to c is to be read: in the think channel
// first when thinking is on, with calls reported when tools are declared
// and tool_choice is not "none".
func (c *Chat) Reply() (ReplyOptions, error) {
	thinking, _, err := Thinking(c.ReasoningEffort)
	if err != nil {
		return ReplyOptions{}, err
	}
	return ReplyOptions{Thinking: thinking, Tools: len(c.Tools) > 0 && c.ChatToolChoice() != "none"}, nil
}

// Constraint returns the grammar the reply to c must follow, or nil: a
// call of a declared tool for tool_choice "required", of the named one for
// a named tool_choice; JSON for a json_object or json_schema
// response_format. thinkBudget bounds the think channel of a constrained
// reply (0: unbounded).
func (c *Chat) Constraint(thinkBudget int) (*grammar.Spec, error) {
	thinking, _, err := Thinking(c.ReasoningEffort)
	if err != nil {
		return nil, err
	}
	spec := &grammar.Spec{Thinking: thinking, ThinkBudget: thinkBudget}
	choice, named := c.ChatToolChoice(), c.namedTool()
	rf := c.ResponseFormatType()
	asJSON := rf == "json_object" || rf == "json_schema"
	if (choice == "required" || named != "") && asJSON {
		return nil, fmt.Errorf("%w: tool_choice %s and response_format %s cannot both hold: a reply is either a call or JSON", ErrChat, c.ToolChoice, rf)
	}
	switch {
	case choice == "required" || named != "":
		spec.Mode, spec.Tool = grammar.ModeToolCall, named
		for i, raw := range c.Tools {
			var t struct {
				Function struct {
					Name       string          `json:"name"`
					Parameters json.RawMessage `json:"parameters"`
				} `json:"function"`
			}
			if err := json.Unmarshal(raw, &t); err != nil || t.Function.Name == "" {
				return nil, fmt.Errorf("%w: tools[%d] is not a function with a name", ErrChat, i)
			}
			spec.Tools = append(spec.Tools, grammar.Tool{Name: t.Function.Name, Parameters: t.Function.Parameters})
		}
	case rf == "json_schema":
		spec.Mode, spec.Schema = grammar.ModeJSONSchema, c.ResponseSchema()
		if spec.Schema == nil {
			return nil, fmt.Errorf("%w: response_format json_schema needs json_schema.schema", ErrChat)
		}
	case rf == "json_object":
		spec.Mode = grammar.ModeJSONObject
	default:
		return nil, nil
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrChat, err)
	}
	return spec, nil
}

// namedTool is the function a named tool_choice names, or "".
func (c *Chat) namedTool() string {
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if len(c.ToolChoice) == 0 || json.Unmarshal(c.ToolChoice, &named) != nil {
		return ""
	}
	return named.Function.Name
}
