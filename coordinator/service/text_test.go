package service_test

import (
	"errors"
	"strings"
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
)

// TestTextPromptsAndStops: on a model with a tokenizer, a text prompt is
// tokenized by the coordinator and its tokens come back as text; a stop
// text ends the job before any of it is published; a chat prompt stops at
// the end of the model's turn when it comes (or at max_tokens).
func TestTextPromptsAndStops(t *testing.T) {
	opt := testOptions(t)
	opt.ModelDir = testmodel.Dir(t, "demo", 1, 2)
	c := startCluster(t, opt)
	nc := connect(t, c)
	const prompt = "Prefill where the compute is, decode where the memory is."

	full := run(t, nc, cp.SubmitRequest{Prompt: prompt, Sampling: cp.Sampling{MaxTokens: 24}})
	if full.Final.State != cp.StateDone || len(full.Tokens) != 24 {
		t.Fatalf("text job: %+v, %d tokens", full.Final, len(full.Tokens))
	}
	want, err := c.Tokenizer.DecodeString(ints(full.Tokens))
	if err != nil {
		t.Fatal(err)
	}
	if full.Text != want {
		t.Fatalf("streamed text %q, the tokens decode to %q", full.Text, want)
	}
	if ids := c.Tokenizer.Encode(prompt); full.Final.Timing.PromptTokens != len(ids) {
		t.Fatalf("prompt of %d tokens, the tokenizer makes %d", full.Final.Timing.PromptTokens, len(ids))
	}

	// A stop text from the middle of what the model says (greedy: it says
	// it again): three characters at the middle, or the nearest after it
	// that are not all space. Whatever the model says, its 24 tokens make
	// some text; the job must end where that text first occurs.
	runes := []rune(full.Text)
	if len(runes) < 3 {
		t.Fatalf("24 tokens decode to %q: want some text to stop in", full.Text)
	}
	at := len(runes) / 2
	for i := at; i+3 <= len(runes); i++ {
		if strings.TrimSpace(string(runes[i:i+3])) != "" {
			at = i
			break
		}
	}
	at = min(at, len(runes)-3)
	stop := string(runes[at : at+3])
	res := run(t, nc, cp.SubmitRequest{Prompt: prompt, Sampling: cp.Sampling{MaxTokens: 24, Stop: cp.Stop{Texts: []string{stop}}}})
	before := full.Text[:strings.Index(full.Text, stop)]
	if res.Final.State != cp.StateDone || res.Finish != cp.FinishStop || res.Text != before || strings.Contains(res.Text, stop) {
		t.Fatalf("stop %q: %s, finish %s, text %q, want %q", stop, res.Final.State, res.Finish, res.Text, before)
	}

	chat := run(t, nc, cp.SubmitRequest{Messages: []cp.ChatMessage{{Role: "user", Content: prompt}}, Sampling: cp.Sampling{MaxTokens: 16}})
	eom := int32(c.Tokenizer.EndOfMessageID())
	if chat.Final.State != cp.StateDone {
		t.Fatalf("chat job: %+v", chat.Final)
	}
	for i, id := range chat.Tokens {
		if id == eom && (i != len(chat.Tokens)-1 || chat.Finish != cp.FinishStop) {
			t.Fatalf("chat went on after the end of its turn: %v (%s)", chat.Tokens, chat.Finish)
		}
	}
}

func ints(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

// TestAdmissionByGroupCapacity: a prompt longer than the decode group can
// hold at all is refused at submission, with the limit in the message.
func TestAdmissionByGroupCapacity(t *testing.T) {
	opt := testOptions(t)
	opt.DecodeMemory = 1 << 20 // 1 MiB of state per rank
	c := startCluster(t, opt)
	nc := connect(t, c)
	capacity := c.Model.MaxTokens(c.Group.Layout.Ranks[0].Lo, c.Group.Layout.Ranks[0].Hi, opt.DecodeMemory)
	for _, r := range c.Group.Layout.Ranks[1:] {
		capacity = min(capacity, c.Model.MaxTokens(r.Lo, r.Hi, opt.DecodeMemory))
	}
	_, err := cp.Submit(t.Context(), nc, &cp.SubmitRequest{TokenIDs: testkit.Prompt(capacity, c.Model.VocabSize, 1), Sampling: cp.Sampling{MaxTokens: 8}})
	var re *cp.RemoteError
	if !errors.As(err, &re) || re.Code != cp.CodeTooLarge || !strings.Contains(re.Message, "holds") {
		t.Fatalf("prompt over the group's capacity (%d tokens): %v", capacity, err)
	}
	res := run(t, nc, cp.SubmitRequest{TokenIDs: testkit.Prompt(64, c.Model.VocabSize, 1), Sampling: cp.Sampling{MaxTokens: 8}})
	if res.Final.State != cp.StateDone {
		t.Fatalf("a prompt that fits: %+v", res.Final)
	}
	t.Logf("capacity %d tokens: %v", capacity, err)
}
