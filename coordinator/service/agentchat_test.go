package service_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/decode-worker/prefixcache"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// TestAgentTurnsFromThePrefixCache: an agent's conversation in K3's format,
// thinking on (K3's default) and tools declared. Each turn the model's
// reply is appended to the history as the API returns it (its
// reasoning_content, content and tool_calls, the calls named as the HTTP
// front door names them), with a tool result, and the next turn is
// submitted. Each turn's prompt must begin with the one before, token for
// token, and go on with the reply re-rendered byte for byte; and the next
// turn must resume from the decode group's prefix cache at the last block
// of the turn before, so that the third turn's hit covers the first turn's
// reply and tool result too.
//
// The cache keeps only prefilled state (prefixcache: states that went
// through decode steps are no snapshots), so a turn's hit is bounded by
// the prompt before it, not by the tokens generated in between; and the
// synthetic model's random weights write no K3 turn (bare bytes, reserved
// specials, merges the tokenizer would not make), so its token ids cannot
// come back as they were written. What must come back is its reply as the
// API returned it. This test fails if the reasoning were dropped from the
// history (the re-rendered turn would not hold the reasoning the model
// wrote), or dropped from earlier turns only, as some templates do once a
// turn is not the latest (the third turn's prompt would leave the second's
// at the first reply's think channel, and its hit would shrink to the
// first turn's prompt).
func TestAgentTurnsFromThePrefixCache(t *testing.T) {
	opt := testOptions(t)
	opt.ModelDir = testmodel.Dir(t, "demo", 1, 2)
	c := startCluster(t, opt)
	nc := connect(t, c)
	tok := c.Tokenizer
	const tools = `[{"type":"function","function":{"name":"read_file","description":"Read a file of the repository.",` +
		`"parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}]`
	// The agent is mid-session: an earlier turn called a tool.
	msgs := []cp.ChatMessage{
		{Role: "system", Content: "You are a coding agent. Read the code before you change it."},
		{Role: "user", Content: "Why does the decode group's prefix cache miss on the second turn?"},
		{Role: "assistant", ReasoningContent: "The cache is in decode-worker/prefixcache. Read it first.",
			ToolCalls: []cp.ToolCall{{ID: "call_0_0", Name: "read_file", Arguments: `{"path": "decode-worker/prefixcache/key.go"}`}}},
		{Role: "tool", ToolCallID: "call_0_0", Content: "// Block is the token block the hash chain covers.\nconst Block = model.KDAChunk\n"},
	}
	var prompts [][]int32
	var hits []int
	for turn := range 3 {
		req := cp.SubmitRequest{Messages: slices.Clone(msgs), Tools: tools, Policy: cp.PolicyLocal, Sampling: cp.Sampling{MaxTokens: 24}}
		chat, err := service.ChatOf(&req)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := tok.EncodeChat(chat)
		if err != nil {
			t.Fatal(err)
		}
		p := make([]int32, len(ids))
		for i, id := range ids {
			p[i] = int32(id)
		}
		res := run(t, nc, req)
		if res.Final.State != cp.StateDone {
			t.Fatalf("turn %d: %+v", turn+1, res.Final)
		}
		tm := res.Final.Timing
		if tm.PromptTokens != len(p) {
			t.Fatalf("turn %d: the coordinator prefilled %d tokens, the chat renders as %d", turn+1, tm.PromptTokens, len(p))
		}
		prompts, hits = append(prompts, p), append(hits, tm.CachedTokens)
		t.Logf("turn %d: %d prompt tokens, %d from the prefix cache; %d generated, %d calls", turn+1, len(p), tm.CachedTokens, len(res.Tokens), len(res.Calls))
		if turn > 0 {
			before := prompts[turn-1]
			if !slices.Equal(p[:len(before)], before) {
				t.Fatalf("turn %d's prompt does not begin with turn %d's (first difference at token %d of %d)", turn+1, turn, firstDiff(p, before), len(before))
			}
			// The reply re-rendered: the model's reasoning, byte for
			// byte, right after the open think channel the last prompt
			// ended with, then the channel's close.
			r := tok.Encode(msgs[len(msgs)-2].ReasoningContent)
			rest := p[len(before):]
			if len(rest) <= len(r) || !slices.Equal(ints(rest[:len(r)]), r) || int(rest[len(r)]) != special(t, tok, tokenizer.Close) {
				t.Fatalf("turn %d: the reply of turn %d is not re-rendered as the API returned it: its reasoning (%d tokens) does not follow the turn's prompt", turn+1, turn, len(r))
			}
			if got, _ := tok.DecodeString(ints(rest[:len(r)])); got != msgs[len(msgs)-2].ReasoningContent {
				t.Fatalf("turn %d: the reasoning comes back as %q, the model wrote %q", turn+1, got, msgs[len(msgs)-2].ReasoningContent)
			}
			// The turn resumes at the last block of the prompt before.
			if want := len(before) / prefixcache.Block * prefixcache.Block; tm.CachedTokens != want || want == 0 {
				t.Fatalf("turn %d: %d tokens from the prefix cache, want %d (turn %d's prompt of %d tokens, to its last block)", turn+1, tm.CachedTokens, want, turn, len(before))
			}
		}
		if res.Reasoning == "" {
			t.Fatalf("turn %d: the model's reply has no reasoning (thinking is on): %+v", turn+1, res)
		}
		// The reply as the API returns it, and the tool's answer.
		reply := cp.ChatMessage{Role: "assistant", Content: res.Text, ReasoningContent: res.Reasoning}
		for i, call := range res.Calls {
			reply.ToolCalls = append(reply.ToolCalls, cp.ToolCall{ID: apiCallID(res.JobID, i), Name: call.Name, Arguments: call.Arguments})
		}
		msgs = append(msgs, reply)
		result := cp.ChatMessage{Role: "tool", Tool: "read_file", Content: fileText(turn)}
		if len(reply.ToolCalls) > 0 {
			result = cp.ChatMessage{Role: "tool", ToolCallID: reply.ToolCalls[0].ID, Content: fileText(turn)}
		}
		msgs = append(msgs, result)
	}
	// The third turn's hit covers the first turn's reply and tool result.
	if hits[2] <= len(prompts[0]) {
		t.Fatalf("turn 3 took %d tokens from the cache, not past turn 1's prompt of %d", hits[2], len(prompts[0]))
	}
}

// apiCallID is the id the HTTP front door gives a reply's call i.
func apiCallID(jobID string, i int) string {
	_, bare, _ := strings.Cut(jobID, "-")
	return "call_" + bare + "_" + strconv.Itoa(i)
}

// fileText is a tool result: with its markers and the reply's (over a
// block), the next turn's prompt reaches a block past the reply.
func fileText(turn int) string {
	var b strings.Builder
	for i := range 3 {
		b.WriteString("func step" + strconv.Itoa(turn*100+i) + "(s *State) error { return s.Advance() }\n")
	}
	return b.String()
}

func special(t *testing.T, tok *tokenizer.Tokenizer, name string) int {
	t.Helper()
	id, ok := tok.SpecialID(name)
	if !ok {
		t.Fatalf("the tokenizer lacks %s", name)
	}
	return id
}

func firstDiff(a, b []int32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
