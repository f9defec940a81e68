package main

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/bench/workload"
	"github.com/tandem-inference/tandem/tokenizer"
)

// TestAgentChats: --chat builds each agent session as a K3 chat at about
// the workload's lengths and the chat's framing (no shorter; a turn's
// reply and result cannot be shorter than their markers), each turn's prompt the one before and more
// (the history re-rendered as it was), with the thinking-effort message,
// the tools, the replies' reasoning and calls and the tools' results; the
// same jobs without their ids replay as token ids of the same lengths.
func TestAgentChats(t *testing.T) {
	dir := t.TempDir()
	if err := tokenizer.WriteSynthetic(dir, 2048, nil); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := workload.Agent(workload.LocalAgent(1, 20))
	if err != nil {
		t.Fatal(err)
	}
	chats, framing, err := agentChats(tok, jobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.Validate(chats); err != nil {
		t.Fatal(err)
	}
	last := map[string]workload.Job{}
	var off, total int
	for i, j := range chats {
		if j.ID != jobs[i].ID || j.Session != jobs[i].Session || j.Turn != jobs[i].Turn || j.Arrival != jobs[i].Arrival || j.Output != jobs[i].Output {
			t.Fatalf("job %d: %+v, the workload's %+v: only the prompt may change", i, j, jobs[i])
		}
		if len(j.Tokens) != j.Prompt {
			t.Fatalf("job %s: %d ids, prompt %d", j.ID, len(j.Tokens), j.Prompt)
		}
		// About the workload's length and the framing: the request
		// exactly so (a word's tokens at most), the later turns no shorter.
		d := j.Prompt - framing - jobs[i].Prompt
		if d < 0 || j.Turn == 0 && d > 4 {
			t.Fatalf("job %s: a prompt of %d tokens for the workload's %d and %d of framing", j.ID, j.Prompt, jobs[i].Prompt, framing)
		}
		off, total = off+d, total+jobs[i].Prompt
		prev, ok := last[j.Session]
		if !ok && j.Turn != 0 || ok && j.Turn != prev.Turn+1 {
			t.Fatalf("job %s: turn %d after %+v", j.ID, j.Turn, prev)
		}
		if ok && !slices.Equal(j.Tokens[:prev.Prompt], prev.Tokens) {
			t.Fatalf("job %s: the prompt does not begin with turn %d's", j.ID, prev.Turn)
		}
		last[j.Session] = j
		if j.Turn == 1 {
			text, err := tok.DecodeString(ints32(j.Tokens))
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"thinking_effort=max", `"name":"read_file"`, `"name":"run"`, `role="assistant"`,
				tokenizer.Close + "think" + tokenizer.Sep, `call tool="read_file" index="1"`, `role="tool" tool="read_file" index="1"`} {
				if !strings.Contains(text, want) {
					t.Fatalf("job %s does not hold %q:\n%s", j.ID, want, text)
				}
			}
			if strings.Contains(text, tokenizer.Open+"think"+tokenizer.Sep+tokenizer.Close) {
				t.Fatalf("job %s: a reply without its reasoning:\n%s", j.ID, text)
			}
		}
	}
	t.Logf("%d tokens of framing; the chats' prompts %d tokens over the workload's %d and the framing (the replies' and results' own framing)", framing, off, total)
	for _, j := range withoutTokens(chats) {
		if j.Tokens != nil || len(promptTokens(j, 2048)) != j.Prompt {
			t.Fatalf("job %s without its ids: %+v", j.ID, j)
		}
	}
	if chats[0].Tokens == nil {
		t.Fatal("withoutTokens changed the jobs it was given")
	}
	if _, _, err := agentChats(tok, []workload.Job{{ID: "x", Prompt: 10, Output: 1}}); err == nil || !strings.Contains(err.Error(), "no agent session") {
		t.Fatalf("a lone job as a chat: %v", err)
	}
	bad := chats[0]
	bad.Prompt++
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "token ids") {
		t.Fatalf("a job whose ids are not its prompt: %v", err)
	}
}

// TestE2EChatFlag: --chat wants the generated agent workload.
func TestE2EChatFlag(t *testing.T) {
	for _, args := range [][]string{{"--chat"}, {"--chat", "--workload", "mix"}, {"--chat", "--workload", "agent", "--trace", filepath.Join(t.TempDir(), "t.jsonl")}} {
		if err := commands["e2e"].run(context.Background(), args); err == nil || !strings.Contains(err.Error(), "--workload agent without --trace") {
			t.Errorf("bench e2e %v: %v", args, err)
		}
	}
}

func ints32(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}
