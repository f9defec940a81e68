package grammar_test

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/tokenizer"
)

const weatherSchema = `{"type": "object", "properties": {
	"city": {"type": "string", "maxLength": 16},
	"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
	"days": {"type": "integer"},
	"detail": {"type": "boolean"},
	"at": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}, "label": {"type": ["string", "null"]}}, "required": ["lat"], "additionalProperties": false},
	"tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b\"q", "ü"]}, "minItems": 1, "maxItems": 3},
	"mode": {"anyOf": [{"type": "integer"}, {"const": "auto"}]},
	"extra": {},
	"level": {"enum": [1, 2.5, "x"]},
	"code": {"enum": [7, null]}
}, "required": ["city", "days"], "additionalProperties": false}`

var testTools = []grammar.Tool{
	{Name: "get_weather", Parameters: json.RawMessage(weatherSchema)},
	{Name: "get_weather_now", Parameters: json.RawMessage(`{"type": "object", "properties": {"id": {"type": "integer", "enum": [1, 2, 30]}}, "required": ["id"]}`)},
	{Name: "ping"},
	{Name: "a&\"b", Parameters: json.RawMessage(`{"type": "object", "additionalProperties": {"type": "integer"}}`)},
}

func schemaOf(tb testing.TB, name string) any {
	for _, t := range testTools {
		if t.Name == name {
			if t.Parameters == nil {
				return nil
			}
			return decodeJSON(tb, string(t.Parameters))
		}
	}
	tb.Fatalf("no tool %q", name)
	return nil
}

// TestToolCallWalks: random walks among the masked tokens always give a
// reply that the ReplyParser reads into calls of declared tools whose
// arguments validate.
func TestToolCallWalks(t *testing.T) {
	tv := vocab(t, 2048)
	for _, tc := range []struct {
		name string
		spec grammar.Spec
	}{
		{"required", grammar.Spec{Mode: grammar.ModeToolCall, Tools: testTools}},
		{"named", grammar.Spec{Mode: grammar.ModeToolCall, Tools: testTools, Tool: "get_weather"}},
		{"thinking", grammar.Spec{Mode: grammar.ModeToolCall, Tools: testTools, Thinking: true}},
		{"budget", grammar.Spec{Mode: grammar.ModeToolCall, Tools: testTools, Thinking: true, ThinkBudget: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := grammar.Compile(&tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			names := map[string]bool{}
			for seed := range uint64(60) {
				ids := walk(t, tv, g, seed, 20000)
				calls, content := parse(t, tv, ids, tc.spec.Thinking)
				if content != "" || len(calls) == 0 {
					t.Fatalf("seed %d: content %q, %d calls", seed, content, len(calls))
				}
				for _, c := range calls {
					if tc.spec.Tool != "" && c.name != tc.spec.Tool {
						t.Fatalf("seed %d: call of %q, want %q", seed, c.name, tc.spec.Tool)
					}
					names[c.name] = true
					args := decodeJSON(t, c.args.String())
					if err := validate(schemaOf(t, c.name), args); err != nil {
						t.Fatalf("seed %d: %s(%s): %v\nreply %q", seed, c.name, c.args.String(), err, decode(tv, ids))
					}
				}
				if tc.spec.ThinkBudget > 0 {
					close := slices.Index(ids, tv.id(tokenizer.Close))
					if close > tc.spec.ThinkBudget {
						t.Fatalf("seed %d: think channel of %d tokens, budget %d", seed, close, tc.spec.ThinkBudget)
					}
				}
			}
			if tc.spec.Tool == "" && len(names) < 3 {
				t.Errorf("walks called only %v", names)
			}
		})
	}
}

// TestJSONWalks: the response is JSON valid against the schema.
func TestJSONWalks(t *testing.T) {
	tv := vocab(t, 2048)
	schema := `{"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "number"},
		"list": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}, "kind": {"enum": ["x", 1, null, true]}},
		"required": ["name", "kind"], "additionalProperties": false}`
	for _, tc := range []struct {
		name   string
		spec   grammar.Spec
		schema string
	}{
		{"schema", grammar.Spec{Mode: grammar.ModeJSONSchema, Schema: json.RawMessage(schema)}, schema},
		{"object", grammar.Spec{Mode: grammar.ModeJSONObject, Thinking: true}, `{"type": "object"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := grammar.Compile(&tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			for seed := range uint64(60) {
				ids := walk(t, tv, g, seed, 20000)
				calls, content := parse(t, tv, ids, tc.spec.Thinking)
				if len(calls) != 0 {
					t.Fatalf("seed %d: %d calls", seed, len(calls))
				}
				if err := validate(decodeJSON(t, tc.schema), decodeJSON(t, content)); err != nil {
					t.Fatalf("seed %d: %q: %v", seed, content, err)
				}
			}
		})
	}
}

// TestRenderedTurn: the grammar accepts an assistant turn as the released
// renderer writes it.
func TestRenderedTurn(t *testing.T) {
	tv := vocab(t, 2048)
	for _, thinking := range []bool{false, true} {
		effort := "none"
		if thinking {
			effort = "high"
		}
		turn := tokenizer.ChatMessage{Role: "assistant", ReasoningContent: "Let me see.", ToolCalls: []tokenizer.ChatToolCall{
			{ID: "1", Function: tokenizer.ChatFunctionCall{Name: "get_weather", Arguments: json.RawMessage(
				`"{\"city\": \"Zürich <|close|>\", \"unit\": \"celsius\", \"days\": 3, \"at\": {\"lat\": 1.5, \"lon\": -2e-05, \"label\": null}, \"tags\": [\"b\\\"q\", \"ü\"], \"mode\": \"auto\", \"extra\": {\"k\": [1, {}]}}"`)}},
			{ID: "2", Function: tokenizer.ChatFunctionCall{Name: "ping"}},
			{ID: "3", Function: tokenizer.ChatFunctionCall{Name: "a&\"b", Arguments: json.RawMessage(`{"x.y": 7}`)}},
		}}
		chat := &tokenizer.Chat{Messages: []tokenizer.ChatMessage{tokenizer.Text("user", "hi"), turn}, NoGenerationPrompt: true, ReasoningEffort: effort}
		segs, err := tokenizer.RenderChat(chat)
		if err != nil {
			t.Fatal(err)
		}
		// The reply starts after the assistant's generation prompt.
		channel := "response"
		if thinking {
			channel = "think"
		}
		start := -1
		for i := 0; i+2 < len(segs); i++ {
			if segs[i].Text == tokenizer.Open && segs[i+1].Text == channel && segs[i+2].Text == tokenizer.Sep {
				start = i + 3
				break
			}
		}
		ids, err := tv.tok.EncodeSegments(segs[start:])
		if err != nil {
			t.Fatal(err)
		}
		g, err := grammar.Compile(&grammar.Spec{Mode: grammar.ModeToolCall, Tools: testTools, Thinking: thinking})
		if err != nil {
			t.Fatal(err)
		}
		m := g.NewMatcher(tv.v)
		mask := make([]uint64, tv.v.MaskWords())
		for i, id := range ids {
			if err := m.Mask(mask); err != nil {
				t.Fatal(err)
			}
			if !grammar.Allowed(mask, id) {
				t.Fatalf("thinking %v: token %d masked off after %q", thinking, i, decode(tv, ids[:i]))
			}
			if err := m.Accept(id); err != nil {
				t.Fatalf("thinking %v: token %d: %v", thinking, i, err)
			}
		}
		if !m.Done() {
			t.Fatalf("thinking %v: not done after the rendered turn", thinking)
		}
	}
}

// TestMaskedOff: tokens that would break the grammar are masked off, and
// Accept refuses them.
func TestMaskedOff(t *testing.T) {
	tv := vocab(t, 2048)
	g, err := grammar.Compile(&grammar.Spec{Mode: grammar.ModeToolCall, Tools: testTools[:2], Tool: "get_weather_now"})
	if err != nil {
		t.Fatal(err)
	}
	m := g.NewMatcher(tv.v)
	mask := make([]uint64, tv.v.MaskWords())
	prefix := []int{tv.id(tokenizer.Close)}
	prefix = append(prefix, tv.tok.Encode("response")...)
	prefix = append(prefix, tv.id(tokenizer.Sep), tv.id(tokenizer.Open))
	prefix = append(prefix, tv.tok.Encode("tools")...)
	prefix = append(prefix, tv.id(tokenizer.Sep), tv.id(tokenizer.Open))
	prefix = append(prefix, tv.tok.Encode(`call tool="get_weather`)...)
	for _, id := range prefix {
		if err := m.Accept(id); err != nil {
			t.Fatalf("%q: %v", decode(tv, prefix), err)
		}
	}
	if err := m.Mask(mask); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		text string
		ok   bool
	}{
		{`_now"`, true}, {`_`, true}, {`"`, false}, {`_then`, false}, {`x`, false},
	} {
		for _, id := range allIDs(tv, tc.text) {
			if grammar.Allowed(mask, id) != tc.ok {
				t.Errorf("token %q allowed %v, want %v", tc.text, !tc.ok, tc.ok)
			}
			if err := m.Accept(id); tc.ok != (err == nil) {
				t.Errorf("Accept(%q) = %v", tc.text, err)
			} else if err != nil && !errors.Is(err, grammar.ErrRejected) {
				t.Errorf("Accept(%q) = %v, not ErrRejected", tc.text, err)
			}
			if err == nil {
				m = g.NewMatcher(tv.v) // start over for the next case
				for _, id := range prefix {
					m.Accept(id)
				}
			}
		}
	}
	for _, name := range []string{tokenizer.Open, tokenizer.Close, tokenizer.EndOfMsg, tokenizer.BOS, tokenizer.EOS} {
		if grammar.Allowed(mask, tv.id(name)) {
			t.Errorf("%s allowed inside a head", name)
		}
	}
}

// allIDs returns the ids whose bytes are exactly text (one, usually).
func allIDs(tv *testVocab, text string) []int {
	var out []int
	for id := range tv.v.Size() {
		if string(tv.tok.TokenBytes(id)) == text {
			out = append(out, id)
		}
	}
	return out
}

func TestDoneAndBudget(t *testing.T) {
	tv := vocab(t, 2048)
	g, err := grammar.Compile(&grammar.Spec{Mode: grammar.ModeJSONObject, Thinking: true, ThinkBudget: 2})
	if err != nil {
		t.Fatal(err)
	}
	m := g.NewMatcher(tv.v)
	mask := make([]uint64, tv.v.MaskWords())
	for _, id := range tv.tok.Encode("ab") {
		if err := m.Accept(id); err != nil {
			t.Fatal(err)
		}
	}
	m.Accept(tv.tok.Encode("c")[0])
	m.Mask(mask)
	if got := allowedIDs(mask, tv.v.Size()); !slices.Equal(got, []int{tv.id(tokenizer.Close)}) {
		t.Fatalf("after the budget, allowed %v, want only <|close|>", got)
	}
	var rest []int
	rest = append(rest, tv.id(tokenizer.Close))
	rest = append(rest, tv.tok.Encode("think")...)
	rest = append(rest, tv.id(tokenizer.Sep), tv.id(tokenizer.Open))
	rest = append(rest, tv.tok.Encode("response")...)
	rest = append(rest, tv.id(tokenizer.Sep))
	rest = append(rest, tv.tok.Encode(`{"a": [1, {}]}`)...)
	rest = append(rest, tv.id(tokenizer.Close))
	rest = append(rest, tv.tok.Encode("response")...)
	rest = append(rest, tv.id(tokenizer.Sep), tv.id(tokenizer.Close))
	rest = append(rest, tv.tok.Encode("message")...)
	for _, id := range rest {
		if m.Done() {
			t.Fatal("done too early")
		}
		if err := m.Accept(id); err != nil {
			t.Fatalf("%q: %v", decode(tv, rest), err)
		}
	}
	if err := m.Accept(tv.id(tokenizer.Sep)); err != nil {
		t.Fatal(err)
	}
	if !m.Done() {
		t.Fatal("not done after the message closed")
	}
	m.Mask(mask)
	if got := allowedIDs(mask, tv.v.Size()); !slices.Equal(got, []int{tv.id(tokenizer.EndOfMsg)}) {
		t.Fatalf("after the message, allowed %v", got)
	}
}

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, params, want string
	}{
		{"ref", `{"type": "object", "properties": {"a": {"$ref": "#/x"}}}`, "not supported"},
		{"not object", `{"type": "string"}`, "object schema"},
		{"bad json", `{"type": `, "schema"},
		{"bad type", `{"type": "object", "properties": {"a": {"type": "date"}}}`, "unknown type"},
		{"required unknown", `{"type": "object", "properties": {"a": {}}, "required": ["b"]}`, "not among"},
		{"deep", strings.Repeat(`{"type": "object", "properties": {"a": `, 20) + "{}" + strings.Repeat("}}", 20), "nested"},
		{"empty enum", `{"type": "object", "properties": {"a": {"type": "string", "enum": [1]}}}`, "enum"},
		{"object enum", `{"type": "object", "properties": {"a": {"enum": [{}]}}}`, "enum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := grammar.Compile(&grammar.Spec{Mode: grammar.ModeToolCall, Tools: []grammar.Tool{{Name: "f", Parameters: json.RawMessage(tc.params)}}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Compile = %v, want an error with %q", err, tc.want)
			}
		})
	}
	if _, err := grammar.Compile(&grammar.Spec{Mode: "xml"}); err == nil {
		t.Fatal("a bad mode compiled")
	}
}

func TestCacheAndDeterminism(t *testing.T) {
	tv := vocab(t, 2048)
	c := grammar.NewCache(2)
	spec := &grammar.Spec{Mode: grammar.ModeToolCall, Tools: testTools}
	g1, err := c.Get(spec)
	if err != nil {
		t.Fatal(err)
	}
	g2, _ := c.Get(&grammar.Spec{Mode: grammar.ModeToolCall, Tools: slices.Clone(testTools)})
	if g1 != g2 {
		t.Fatal("the same spec compiled twice")
	}
	g3, _ := grammar.Compile(spec)
	for seed := range uint64(5) {
		a, b := walk(t, tv, g1, seed, 20000), walk(t, tv, g3, seed, 20000)
		if !slices.Equal(a, b) {
			t.Fatalf("seed %d: walks differ between grammars", seed)
		}
	}
}

// TestStringsAreWellFormedUTF8: walks that prefer the bytes at the edges
// of UTF-8's well-formed ranges still give strings of well-formed UTF-8 (no overlong forms, no
// surrogates), raw argument values and JSON strings alike: a decoder
// would read each stray byte as U+FFFD and break maxLength.
func TestStringsAreWellFormedUTF8(t *testing.T) {
	tv := vocab(t, 2048)
	str := `{"type": "object", "properties": {"s": {"type": "string", "maxLength": 8}}, "required": ["s"]}`
	for _, spec := range []grammar.Spec{
		{Mode: grammar.ModeToolCall, Tools: []grammar.Tool{{Name: "f", Parameters: json.RawMessage(str)}}},
		{Mode: grammar.ModeJSONSchema, Schema: json.RawMessage(str)},
	} {
		g, err := grammar.Compile(&spec)
		if err != nil {
			t.Fatal(err)
		}
		mask := make([]uint64, tv.v.MaskWords())
		for seed := range uint64(100) {
			rng := rand.New(rand.NewPCG(seed, 2))
			m := g.NewMatcher(tv.v)
			var raw []byte
			for step := 0; !m.Ended(); step++ {
				if step > 5000 {
					t.Fatalf("%s seed %d: no end", spec.Mode, seed)
				}
				if err := m.Mask(mask); err != nil {
					t.Fatal(err)
				}
				all := allowedIDs(mask, tv.v.Size())
				var high []int
				for _, id := range all {
					// The edges of the well-formed ranges: the leads
					// whose second byte is narrowed and the bytes a
					// loose grammar would let follow them.
					if b := tv.tok.TokenBytes(id); len(b) > 0 && (b[0] == 0xE0 || b[0] == 0xED || b[0] == 0xF0 || b[0] == 0xF4 || b[0] >= 0x80 && b[0] <= 0x9F) {
						high = append(high, id)
					}
				}
				pool := all
				if len(high) > 0 && rng.IntN(4) > 0 {
					pool = high
				}
				id := pool[rng.IntN(len(pool))]
				if err := m.Accept(id); err != nil {
					t.Fatal(err)
				}
				if !tv.tok.IsSpecial(id) {
					raw = append(raw, tv.tok.TokenBytes(id)...)
				}
			}
			if !utf8.Valid(raw) {
				t.Fatalf("%s seed %d: %q is not well-formed UTF-8", spec.Mode, seed, raw)
			}
		}
	}
}
