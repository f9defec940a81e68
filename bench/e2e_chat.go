package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/tandem-inference/tandem/bench/workload"
	"github.com/tandem-inference/tandem/tokenizer"
)

// agentTools are the tools every chat session declares.
var agentTools = []json.RawMessage{
	json.RawMessage(`{"type":"function","function":{"name":"read_file","description":"Read a file of the repository.",` +
		`"parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}`),
	json.RawMessage(`{"type":"function","function":{"name":"run","description":"Run a shell command in the repository.",` +
		`"parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}`),
}

const agentSystem = "You are a coding agent working in a Go repository. Read the code before you change it, and run the tests after."

// chatWords are the words the chats' texts are drawn from.
var chatWords = strings.Fields(`the decode group prefill worker state cache prefix block token turn session
	reply tool call result file test error build package func return struct config rank layer expert weight
	snapshot chunk router policy queue stream latency budget memory link transfer compute step pass job
	first last next before after because so then read write check run fix change keep drop hold`)

// agentChats returns the agent sessions of jobs as K3 chats, each turn's
// prompt rendered with tok (tokenizer.EncodeChat) into the job's Tokens,
// its Prompt their number. Thinking is on (K3's default) and two tools are
// declared: the tool declarations, the thinking-effort message and the
// system message are the chat's framing, the same in every session, and
// framing is its length in tokens. A session's first turn is the framing
// and a user's request; every later turn appends the turn before's reply
// as the API returns it (reasoning_content of about two thirds of the
// tokens it generated, a tool call) and the tool's result. The request and
// the results bring each prompt to about the job's length plus the
// framing, where the reply leaves room: a result has 8 tokens at least,
// and a reply and a result take their markers (about 170 tokens on a
// synthetic model's 2048-id vocabulary), so a session whose turns grow by
// less than that drifts longer than its job.
// Each turn's prompt must begin with the one before it, token for token
// (the history re-rendered as it was): an error says where one does not.
func agentChats(tok *tokenizer.Tokenizer, jobs []workload.Job) (out []workload.Job, framing int, err error) {
	head, err := tok.EncodeChat(&tokenizer.Chat{Tools: agentTools, Messages: []tokenizer.ChatMessage{tokenizer.Text("system", agentSystem)},
		NoGenerationPrompt: true})
	if err != nil {
		return nil, 0, fmt.Errorf("--chat: %w", err)
	}
	framing = len(head)
	out = slices.Clone(jobs)
	sessions := map[string][]int{} // job indices by session, in turn order
	var order []string
	for i, j := range out {
		if j.Session == "" {
			return nil, 0, fmt.Errorf("--chat: job %s is no agent session's turn", j.ID)
		}
		if _, ok := sessions[j.Session]; !ok {
			order = append(order, j.Session)
		}
		sessions[j.Session] = append(sessions[j.Session], i)
	}
	for _, s := range order {
		idx := sessions[s]
		slices.SortStableFunc(idx, func(a, b int) int { return out[a].Turn - out[b].Turn })
		h := fnv.New64a()
		h.Write([]byte(s))
		r := rand.New(rand.NewPCG(h.Sum64(), 0x636861740a))
		chat := &tokenizer.Chat{Tools: agentTools, Messages: []tokenizer.ChatMessage{tokenizer.Text("system", agentSystem)}}
		var prev []int32
		for k, i := range idx {
			j := &out[i]
			var filled *tokenizer.ChatMessage
			if k == 0 {
				chat.Messages = append(chat.Messages, tokenizer.Text("user", ""))
			} else {
				// The reply to the turn before: its reasoning, and a call.
				gen := out[idx[k-1]].Output
				reply := tokenizer.Text("assistant", "")
				reply.ReasoningContent = fill(tok, r, max(1, gen*2/3))
				id := fmt.Sprintf("call_%s_%d_0", s, k-1)
				args, _ := json.Marshal(fmt.Sprintf(`{"path": "internal/%s/%s.go"}`, pick(r), pick(r)))
				reply.ToolCalls = []tokenizer.ChatToolCall{{ID: id, Type: "function",
					Function: tokenizer.ChatFunctionCall{Name: "read_file", Arguments: args}}}
				result := tokenizer.Text("tool", "")
				result.ToolCallID = id
				chat.Messages = append(chat.Messages, reply, result)
			}
			filled = &chat.Messages[len(chat.Messages)-1]
			// The last message (the user's request, the tool's result)
			// brings the prompt to the job's length.
			base, err := tok.EncodeChat(chat)
			if err != nil {
				return nil, 0, fmt.Errorf("--chat: session %s, turn %d: %w", s, j.Turn, err)
			}
			text := fill(tok, r, max(8, framing+j.Prompt-len(base)))
			filled.Content, _ = json.Marshal(text)
			ids, err := tok.EncodeChat(chat)
			if err != nil {
				return nil, 0, fmt.Errorf("--chat: session %s, turn %d: %w", s, j.Turn, err)
			}
			j.Tokens = make([]int32, len(ids))
			for n, id := range ids {
				j.Tokens[n] = int32(id)
			}
			j.Prompt = len(ids)
			if len(prev) > 0 && (len(prev) > len(j.Tokens) || !slices.Equal(prev, j.Tokens[:len(prev)])) {
				at := 0
				for at < min(len(prev), len(j.Tokens)) && prev[at] == j.Tokens[at] {
					at++
				}
				return nil, 0, fmt.Errorf("--chat: session %s: turn %d's prompt leaves turn %d's at token %d of %d: the history did not re-render as it was",
					s, j.Turn, out[idx[k-1]].Turn, at, len(prev))
			}
			prev = j.Tokens
		}
	}
	return out, framing, nil
}

// withoutTokens returns jobs without their token ids: a replay makes ids of
// the same lengths of its own, a session's turns extending one another.
func withoutTokens(jobs []workload.Job) []workload.Job {
	out := slices.Clone(jobs)
	for i := range out {
		out[i].Tokens = nil
	}
	return out
}

func pick(r *rand.Rand) string { return chatWords[r.IntN(len(chatWords))] }

// fill returns words drawn from r that encode to about n tokens (at least
// n, a word's tokens more at most).
func fill(tok *tokenizer.Tokenizer, r *rand.Rand, n int) string {
	var b strings.Builder
	have := 0
	for have < n {
		// A word is a token or a few: add a third of what is missing.
		for range max(1, (n-have)/3) {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(pick(r))
		}
		have = len(tok.Encode(b.String()))
	}
	return b.String()
}
