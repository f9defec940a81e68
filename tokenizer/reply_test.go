package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestEncodeChatTools(t *testing.T) {
	tok := testTokenizer(t, "small")
	msgs := []Message{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", Content: "Checking.", ToolCalls: []ToolCall{{ID: `call_"1"`, Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", ToolCallID: `call_"1"`, Content: `{"temp":21}`},
	}
	const head = `<|open|>tools<|sep|>[{"name":"get_weather"}]<|close|>tools<|sep|><|end_of_msg|>` +
		`<|open|>message role="user"<|sep|>Weather in Paris?<|close|>message<|sep|><|end_of_msg|>` +
		`<|open|>message role="assistant"<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>` +
		`<|open|>tool_call id="call_&quot;1&quot;" name="get_weather"<|sep|>{"city":"Paris"}<|close|>tool_call<|sep|>` +
		`<|close|>message<|sep|><|end_of_msg|>` +
		`<|open|>message role="tool" tool_call_id="call_&quot;1&quot;"<|sep|>{"temp":21}<|close|>message<|sep|><|end_of_msg|>` +
		`<|open|>message role="assistant"<|sep|>`
	for _, tt := range []struct {
		opts ChatOptions
		want string
	}{
		{ChatOptions{OpenAssistant: true}, head + `<|open|>response<|sep|>`},
		{ChatOptions{OpenAssistant: true, CallName: "get_weather"}, head + `<|open|>response<|sep|><|close|>response<|sep|><|open|>tool_call name="get_weather"<|sep|>`},
		{ChatOptions{OpenAssistant: true, CallAny: true}, head + `<|open|>response<|sep|><|close|>response<|sep|><|open|>`},
	} {
		tt.opts.Tools = `[{"name":"get_weather"}]`
		ids, err := tok.EncodeChat(msgs, tt.opts)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := tok.DecodeString(ids)
		if got != tt.want {
			t.Errorf("%+v:\n got %s\nwant %s", tt.opts, got, tt.want)
		}
		want, err := tok.EncodeWithSpecials(tt.want, Open, Close, Sep, EndOfMsg)
		if err != nil {
			t.Fatal(err)
		}
		if !equalInts(ids, want) {
			t.Errorf("%+v: ids differ from encoding the framed text with the markers allowed", tt.opts)
		}
	}
	for _, bad := range []Message{
		{Role: "user", Content: "x", ToolCalls: []ToolCall{{Name: "f"}}},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "c"}}},
		{Role: "tool", Content: "x", Thinking: "y"},
	} {
		if _, err := tok.EncodeChat([]Message{bad}, ChatOptions{}); err == nil {
			t.Errorf("%+v: rendered, want an error", bad)
		}
	}
}

// collect runs ids through p and gathers the content and the calls.
func collect(p *ReplyParser, ids []int) (string, []ToolCall) {
	var content strings.Builder
	var calls []ToolCall
	add := func(d ReplyDelta) {
		content.WriteString(d.Content)
		if d.Call >= 0 {
			if d.Start {
				calls = append(calls, ToolCall{ID: d.ID, Name: d.Name})
			}
			calls[d.Call].Arguments += d.Arguments
		}
	}
	for _, id := range ids {
		add(p.Push(id))
	}
	add(p.Finish())
	return content.String(), calls
}

// TestReplyParserReadsWhatEncodeChatWrites: an assistant turn rendered by
// EncodeChat, fed token by token after its open prefix, gives back its
// content and calls.
func TestReplyParserReadsWhatEncodeChatWrites(t *testing.T) {
	tok := testTokenizer(t, "small")
	turn := Message{Role: "assistant", Content: "Sure — two lookups. ünïcödé 東京",
		ToolCalls: []ToolCall{{Name: "get_weather", Arguments: `{"city":"Zürich"}`}, {Name: "get_time", Arguments: `{"tz":"Asia/Tokyo"}`}}}
	prefix, err := tok.EncodeChat(nil, ChatOptions{OpenAssistant: true})
	if err != nil {
		t.Fatal(err)
	}
	full, err := tok.EncodeChat([]Message{turn}, ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equalInts(full[:len(prefix)], prefix) {
		t.Fatal("the rendered turn does not start with the open-turn prefix")
	}
	content, calls := collect(tok.NewReplyParser(ChatOptions{OpenAssistant: true}, true), full[len(prefix):])
	if content != turn.Content {
		t.Errorf("content %q, want %q", content, turn.Content)
	}
	if len(calls) != 2 || calls[0] != turn.ToolCalls[0] || calls[1] != turn.ToolCalls[1] {
		t.Errorf("calls %+v, want %+v", calls, turn.ToolCalls)
	}
	p := tok.NewReplyParser(ChatOptions{OpenAssistant: true}, true)
	collect(p, full[len(prefix):])
	if p.Calls() != 2 || p.Closed() != 2 {
		t.Errorf("calls %d closed %d, want 2 and 2", p.Calls(), p.Closed())
	}
	// Without tools the calls are dropped, the content stays.
	content, calls = collect(tok.NewReplyParser(ChatOptions{OpenAssistant: true}, false), full[len(prefix):])
	if content != turn.Content || len(calls) != 0 {
		t.Errorf("tools off: content %q calls %+v", content, calls)
	}
}

// TestReplyParserForcedCall: a turn opened inside a call (CallName) reads
// the arguments as the call's; CallAny reads the head the model writes.
func TestReplyParserForcedCall(t *testing.T) {
	tok := testTokenizer(t, "small")
	args := tok.Encode(`{"city":"Oslo"}`)
	closeCall, _ := tok.EncodeWithSpecials(`<|close|>tool_call<|sep|><|close|>message<|sep|>`, Close, Sep)
	p := tok.NewReplyParser(ChatOptions{OpenAssistant: true, CallName: "f"}, true)
	var got string
	for _, id := range append(append(args, closeCall...), tok.Encode("after the end")...) {
		d := p.Push(id)
		if d.Content != "" || (d.Arguments != "" && d.Call != 0) {
			t.Fatalf("delta %+v: want arguments of call 0 only", d)
		}
		got += d.Arguments
	}
	if got != `{"city":"Oslo"}` || p.Closed() != 1 {
		t.Errorf("arguments %q closed %d", got, p.Closed())
	}
	head, _ := tok.EncodeWithSpecials(`tool_call name="g"<|sep|>{}<|close|>tool_call<|sep|>`, Close, Sep)
	_, calls := collect(tok.NewReplyParser(ChatOptions{OpenAssistant: true, CallAny: true}, true), head)
	if len(calls) != 1 || calls[0].Name != "g" || calls[0].Arguments != "{}" {
		t.Errorf("CallAny: calls %+v", calls)
	}
}

// TestReplyParserNoise: random tokens, specials among them, never panic,
// never put a special token's name into the text, and keep the head bounded.
func TestReplyParserNoise(t *testing.T) {
	tok := testTokenizer(t, "small")
	r := rand.New(rand.NewPCG(1, 2))
	open, _ := tok.SpecialID(Open)
	for round := range 200 {
		p := tok.NewReplyParser(ChatOptions{OpenAssistant: true, CallAny: round%2 == 0}, true)
		ids := make([]int, 400)
		for i := range ids {
			switch r.IntN(8) {
			case 0:
				ids[i] = tok.NumRanks() + r.IntN(8) // the markers and their neighbours
			case 1:
				ids[i] = open
			default:
				ids[i] = r.IntN(tok.VocabSize())
			}
		}
		content, calls := collect(p, ids)
		for _, name := range []string{Open, Close, Sep, EndOfMsg} {
			if strings.Contains(content, name) {
				t.Fatalf("round %d: content holds %s", round, name)
			}
		}
		if len(calls) != p.Calls() || p.Closed() > p.Calls() || len(p.head) > maxHead+64 {
			t.Fatalf("round %d: %d calls reported, %d started, %d closed, head %d bytes", round, len(calls), p.Calls(), p.Closed(), len(p.head))
		}
	}
}
