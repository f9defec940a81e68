package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// parsedReply is what a ReplyParser made of a turn.
type parsedReply struct {
	reasoning, content string
	names, args        []string
	malformed, done    bool
}

func parseReply(p *ReplyParser, ids []int) parsedReply {
	var r parsedReply
	add := func(d ReplyDelta) {
		r.reasoning += d.Reasoning
		r.content += d.Content
		if d.Start {
			r.names = append(r.names, d.Name)
			r.args = append(r.args, "")
		}
		if d.Call >= 0 && d.Call < len(r.args) {
			r.args[d.Call] += d.Arguments
		}
	}
	for _, id := range ids {
		add(p.Push(id))
	}
	add(p.Finish())
	r.malformed, r.done = p.Malformed(), p.Done()
	return r
}

// assistantTurns yields every assistant message of the golden
// conversations as the ids the model would have generated for it: the
// history rendered through the message, less the same history ending at
// the generation prompt.
func assistantTurns(t *testing.T, tok *Tokenizer, yield func(name string, thinking bool, m ChatMessage, reply []int)) {
	names, chats := k3Chats(t)
	for _, name := range names {
		c := *chats[name]
		c.ToolChoice, c.ResponseFormat = nil, nil // their messages come after the history
		thinking, _, _ := Thinking(c.ReasoningEffort)
		for i, m := range c.Messages {
			if m.Role != "assistant" || m.Name != "" {
				continue
			}
			before, after := c, c
			before.Messages, before.NoGenerationPrompt = c.Messages[:i], false
			after.Messages, after.NoGenerationPrompt = c.Messages[:i+1], true
			p, err := tok.EncodeChat(&before)
			if err != nil {
				t.Fatal(err)
			}
			q, err := tok.EncodeChat(&after)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(q[:len(p)], p) {
				t.Fatalf("%s: message %d: the generation prompt is not where the turn starts", name, i)
			}
			yield(name, thinking, m, q[len(p):])
		}
	}
}

// wantArguments is a call's arguments as the parser rebuilds them: the
// JSON object, or the text of a json block.
func wantArguments(t *testing.T, raw json.RawMessage) (any, string) {
	args, block, err := callArguments(raw)
	if err != nil {
		t.Fatal(err)
	}
	if block != "" {
		return nil, block
	}
	var v any
	if err := json.Unmarshal([]byte(args.dump(dumpDefault)), &v); err != nil {
		t.Fatal(err)
	}
	return v, ""
}

func TestReplyParserReadsEveryRenderedTurn(t *testing.T) {
	tok := testTokenizer(t, "k3")
	turns := 0
	assistantTurns(t, tok, func(name string, thinking bool, m ChatMessage, reply []int) {
		turns++
		got := parseReply(tok.NewReplyParser(ReplyOptions{Thinking: thinking, Tools: true}), reply)
		if got.malformed || !got.done {
			t.Errorf("%s: malformed %v, done %v", name, got.malformed, got.done)
		}
		var content string
		_ = json.Unmarshal(m.Content, &content)
		if got.content != content {
			t.Errorf("%s: content %q, want %q", name, got.content, content)
		}
		reasoning := m.ReasoningContent
		if reasoning == "" {
			reasoning = m.Reasoning
		}
		if !thinking || pyStrip(reasoning) == "" {
			reasoning = ""
		}
		if got.reasoning != reasoning {
			t.Errorf("%s: reasoning %q, want %q", name, got.reasoning, reasoning)
		}
		if len(got.names) != len(m.ToolCalls) {
			t.Fatalf("%s: %d calls, want %d", name, len(got.names), len(m.ToolCalls))
		}
		for j, c := range m.ToolCalls {
			if got.names[j] != c.Function.Name {
				t.Errorf("%s: call %d names %q, want %q", name, j, got.names[j], c.Function.Name)
			}
			want, block := wantArguments(t, c.Function.Arguments)
			if block != "" {
				if got.args[j] != block {
					t.Errorf("%s: call %d: arguments %q, want the json block %q", name, j, got.args[j], block)
				}
				continue
			}
			var v any
			if err := json.Unmarshal([]byte(got.args[j]), &v); err != nil || !reflect.DeepEqual(v, want) {
				t.Errorf("%s: call %d: arguments %s (%v), want %v", name, j, got.args[j], err, want)
			}
		}
	})
	if turns < 20 {
		t.Fatalf("only %d assistant turns in the goldens", turns)
	}
}

// Truncated at every token, a turn parses to a prefix of the whole: the
// reasoning and each call's arguments are prefixes, the content is a
// prefix possibly followed by a marker the parser kept, and the turn is
// malformed unless the message was closed.
func TestReplyParserTruncatedAtEveryToken(t *testing.T) {
	tok := testTokenizer(t, "k3")
	assistantTurns(t, tok, func(name string, thinking bool, _ ChatMessage, reply []int) {
		opts := ReplyOptions{Thinking: thinking, Tools: true}
		whole := parseReply(tok.NewReplyParser(opts), reply)
		for k := range reply {
			got := parseReply(tok.NewReplyParser(opts), reply[:k])
			// A cut inside a character ends the text with U+FFFD.
			cut := func(s string) string { return strings.TrimSuffix(s, "\uFFFD") }
			got.reasoning, got.content = cut(got.reasoning), cut(got.content)
			for j := range got.args {
				got.args[j] = cut(got.args[j])
			}
			if !got.malformed && !got.done {
				t.Fatalf("%s: cut at %d of %d: neither malformed nor done", name, k, len(reply))
			}
			content := got.content
			if i := strings.Index(content, "<|"); i >= 0 && !strings.HasPrefix(whole.content[min(i, len(whole.content)):], "<|") {
				content = content[:i] // a marker the parser kept
			}
			if !strings.HasPrefix(whole.content, content) || !strings.HasPrefix(whole.reasoning, got.reasoning) {
				t.Fatalf("%s: cut at %d: reasoning %q content %q are not prefixes of %q, %q", name, k, got.reasoning, got.content, whole.reasoning, whole.content)
			}
			if len(got.names) > len(whole.names) {
				t.Fatalf("%s: cut at %d: %d calls of %d", name, k, len(got.names), len(whole.names))
			}
			for j := range got.names {
				if got.names[j] != whole.names[j] || !strings.HasPrefix(whole.args[j], got.args[j]) {
					t.Fatalf("%s: cut at %d: call %d %s(%s) is not a prefix of %s(%s)", name, k, j, got.names[j], got.args[j], whole.names[j], whole.args[j])
				}
			}
		}
	})
}

func TestReplyParserKeepsWhatItCannotRead(t *testing.T) {
	tok := testTokenizer(t, "k3")
	enc := func(s string) []int {
		ids, err := tok.EncodeWithSpecials(s)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	for _, tt := range []struct {
		name, in        string
		tools           bool
		content         string
		calls           int
		malformed, done bool
	}{
		{"plain", `Hi<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>`, true, "Hi", 0, false, true},
		{"unknown element", `a<|open|>bogus x="1"<|sep|>b<|close|>response<|sep|><|close|>message<|sep|>`, true, `a<|open|>bogus x="1"<|sep|>b`, 0, true, true},
		{"call without tool", `<|close|>response<|sep|><|open|>tools<|sep|><|open|>call<|sep|><|close|>call<|sep|>`, true, `<|open|>call<|sep|><|close|>call<|sep|>`, 0, true, false},
		{"tools off keeps the element as text", `ok<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>`, false,
			`ok<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>`, 0, false, true},
		{"bad value", `<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument key="n" type="number"<|sep|>abc<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>`, true, "", 1, true, true},
		{"text after the message", `x<|close|>response<|sep|><|close|>message<|sep|>tail`, true, "x", 0, false, true},
		{"stray sep", `a<|sep|>b<|close|>response<|sep|><|close|>message<|sep|>`, true, "a<|sep|>b", 0, true, true},
	} {
		got := parseReply(tok.NewReplyParser(ReplyOptions{Tools: tt.tools}), enc(tt.in))
		if got.content != tt.content || len(got.names) != tt.calls || got.malformed != tt.malformed || got.done != tt.done {
			t.Errorf("%s: content %q calls %d malformed %v done %v; want %q %d %v %v", tt.name, got.content, len(got.names), got.malformed, got.done,
				tt.content, tt.calls, tt.malformed, tt.done)
		}
	}
}

// Random tokens, markers among them, never make the parser fail or hold
// more than its bounds.
func TestReplyParserNoise(t *testing.T) {
	tok := testTokenizer(t, "small")
	markers := []int{}
	for _, m := range []string{Open, Close, Sep, EndOfMsg, BOS} {
		id, _ := tok.SpecialID(m)
		markers = append(markers, id)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		p := tok.NewReplyParser(ReplyOptions{Thinking: rng.IntN(2) == 0, Tools: true})
		for range 500 {
			id := rng.IntN(tok.VocabSize() + 10)
			if rng.IntN(4) == 0 {
				id = markers[rng.IntN(len(markers))]
			}
			p.Push(id)
			if len(p.head) > maxHead+64 {
				t.Fatalf("head grew to %d bytes", len(p.head))
			}
		}
		p.Finish()
	}
}
