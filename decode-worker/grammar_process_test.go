package main

import (
	"encoding/json"
	"testing"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/internal/schemacheck"
	"github.com/tandem-inference/tandem/internal/testctx"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

// TestControlPlaneGrammar: a job whose sampling carries a grammar, sent
// through the coordinator over NATS to a decode group of two processes
// (random weights, temperature 1), comes back as a reply that parses into
// a call of the declared tool whose arguments validate.
func TestControlPlaneGrammar(t *testing.T) {
	if testing.Short() {
		t.Skip("decode-worker processes over NATS; -short (TestGrammarToolCalls in decode-worker/group covers the group)")
	}
	dir := testmodel.Dir(t, "demo", 1, 2)
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testctx.Context(t)
	d := startDeployment(ctx, t, dir)
	d.group(t, dir, 2)
	d.waitRegistered(ctx, t, 2)

	const schema = `{"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer"},
		"metric": {"type": "boolean"}}, "required": ["city", "days"], "additionalProperties": false}`
	fn, _ := json.Marshal(map[string]any{"type": "function", "function": map[string]any{"name": "forecast", "parameters": json.RawMessage(schema)}})
	chat := &tokenizer.Chat{Messages: []tokenizer.ChatMessage{tokenizer.Text("user", "Weather in Paris?")},
		Tools: []json.RawMessage{fn}, ToolChoice: json.RawMessage(`{"type": "function", "function": {"name": "forecast"}}`), ReasoningEffort: "none"}
	spec, err := chat.Constraint(0)
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
	want, _ := schemacheck.Decode(schema)
	for seed := range uint64(3) {
		res, err := client.Run(ctx, d.cl, cp.SubmitRequest{TokenIDs: prompt,
			Sampling: cp.Sampling{MaxTokens: 500, Temperature: 1, Seed: seed, Grammar: spec}}, client.Handlers{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Final.State != cp.StateDone {
			t.Fatalf("seed %d: job %+v", seed, res.Final)
		}
		p := tok.NewReplyParser(tokenizer.ReplyOptions{Tools: true})
		var args []string
		for _, id := range res.Tokens {
			dl := p.Push(int(id))
			if dl.Start {
				args = append(args, "")
			}
			if dl.Call >= 0 {
				args[dl.Call] += dl.Arguments
			}
		}
		text, _ := tok.DecodeString(ints(res.Tokens))
		if p.Malformed() || !p.Done() || len(args) == 0 {
			t.Fatalf("seed %d: reply %q", seed, text)
		}
		for _, a := range args {
			v, err := schemacheck.Decode(a)
			if err != nil {
				t.Fatal(err)
			}
			if err := schemacheck.Validate(want, v); err != nil {
				t.Fatalf("seed %d: %v in %q", seed, err, text)
			}
		}
	}
}

func ints(ids []int32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}
