package group

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/internal/schemacheck"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// bookSchema has types, required keys, enums, a nested object and
// additionalProperties false, and no free strings, so that a random model
// ends its reply in a few dozen tokens.
const bookSchema = `{"type": "object", "properties": {
	"room": {"type": "string", "enum": ["single", "double", "suite"]},
	"nights": {"type": "integer"},
	"breakfast": {"type": "boolean"},
	"rate": {"type": "number"},
	"guest": {"type": "object", "properties": {"age": {"type": "integer"}, "vip": {"type": ["boolean", "null"]}}, "required": ["age"], "additionalProperties": false},
	"extras": {"type": "array", "items": {"enum": ["parking", "late", 3]}, "maxItems": 3}
}, "required": ["room", "nights"], "additionalProperties": false}`

// grammarChat is a chat that requires a call of book.
func grammarChat(thinking bool) *tokenizer.Chat {
	tool, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]any{"name": "book", "parameters": json.RawMessage(bookSchema)}})
	effort := "none"
	if thinking {
		effort = "low"
	}
	return &tokenizer.Chat{Messages: []tokenizer.ChatMessage{tokenizer.Text("user", "Book me a room for two nights.")},
		Tools: []json.RawMessage{tool}, ToolChoice: json.RawMessage(`"required"`), ReasoningEffort: effort}
}

// TestGrammarToolCalls: on a random model at temperature 1, every reply
// drawn within the grammar is a call of the declared tool whose arguments
// validate, and it ends with <|end_of_msg|>.
func TestGrammarToolCalls(t *testing.T) {
	dir := testmodel.Dir(t, "demo", 1, 2)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	g := startGroup(t, Options{ModelDir: dir, Ranks: 2})
	ctx := testctx.Context(t)
	schema, err := schemacheck.Decode(bookSchema)
	if err != nil {
		t.Fatal(err)
	}
	seeds := 20
	if testing.Short() {
		seeds = 4
	}
	c := NewCollector()
	type job struct {
		id       string
		thinking bool
	}
	var jobs []job
	errs := make(chan error, seeds)
	for seed := range seeds {
		thinking := seed%2 == 1
		chat := grammarChat(thinking)
		spec, err := chat.Constraint(4)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := tok.EncodeChat(chat)
		if err != nil {
			t.Fatal(err)
		}
		prompt := make([]int32, len(ids))
		for i, id := range ids {
			prompt[i] = int32(id)
		}
		j := job{name("g%d", seed), thinking}
		jobs = append(jobs, j)
		req := pipeline.Request{ID: j.id, Tokens: prompt, MaxTokens: 600, Grammar: spec, Sink: c,
			Sampling: sampling.Params{Temperature: 1, Seed: uint64(seed)}}
		go func() { errs <- g.Head().Submit(ctx, req) }()
	}
	for range seeds {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	eom := tok.EndOfMessageID()
	for _, j := range jobs {
		toks, res, err := c.Wait(ctx, j.id)
		if err != nil {
			t.Fatal(err)
		}
		text, _ := tok.DecodeString(ints(toks))
		if res.Reason != pipeline.ReasonStop || len(toks) == 0 || int(toks[len(toks)-1]) != eom {
			t.Fatalf("%s: ended %s (%v) after %d tokens: %q", j.id, res.Reason, res.Err, len(toks), text)
		}
		p := tok.NewReplyParser(tokenizer.ReplyOptions{Thinking: j.thinking, Tools: true})
		args := map[int]*strings.Builder{}
		calls := 0
		for _, id := range toks {
			d := p.Push(int(id))
			if d.Content != "" {
				t.Fatalf("%s: content %q in %q", j.id, d.Content, text)
			}
			if d.Start {
				calls++
				args[d.Call] = &strings.Builder{}
				if d.Name != "book" {
					t.Fatalf("%s: call of %q", j.id, d.Name)
				}
			}
			if d.Call >= 0 {
				args[d.Call].WriteString(d.Arguments)
			}
		}
		if p.Malformed() || !p.Done() || calls == 0 || p.Closed() != calls {
			t.Fatalf("%s: malformed reply %q", j.id, text)
		}
		for i := range calls {
			v, err := schemacheck.Decode(args[i].String())
			if err != nil {
				t.Fatalf("%s: %v", j.id, err)
			}
			if err := schemacheck.Validate(schema, v); err != nil {
				t.Fatalf("%s: call %d: %v\n%q", j.id, i, err, text)
			}
		}
		t.Logf("%s: %d tokens, %d calls: %s", j.id, len(toks), calls, args[0].String())
	}
	g.checkFreed(t)
}

// TestGrammarRefused: a grammar that cannot compile fails the submission.
func TestGrammarRefused(t *testing.T) {
	dir := testmodel.Dir(t, "demo", 1, 2)
	g := startGroup(t, Options{ModelDir: dir, Ranks: 1})
	ctx := testctx.Context(t)
	spec := &grammar.Spec{Mode: grammar.ModeToolCall, Tools: []grammar.Tool{{Name: "f", Parameters: json.RawMessage(`{"type": "object", "properties": {"a": {"$ref": "#/x"}}}`)}}}
	err := g.Head().Submit(ctx, pipeline.Request{ID: "bad", Tokens: []int32{1, 2, 3}, MaxTokens: 4, Grammar: spec, Sink: NewCollector()})
	if err == nil || !strings.Contains(err.Error(), "$ref") {
		t.Fatalf("Submit = %v, want the schema's error", err)
	}
}

func ints(ids []int32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}
