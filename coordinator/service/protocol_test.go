package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/internal/natstest"
	"github.com/tandem-inference/tandem/internal/testkit"
)

// TestJSONJobWithTheNATSCLI: a job submitted as JSON by the real nats CLI
// runs to the end, and the CLI sees it done in the JSON job list.
func TestJSONJobWithTheNATSCLI(t *testing.T) {
	natstest.Tool(t, "nats")
	c := startCluster(t, testOptions(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := natstest.CLI(ctx, t, c.URL, append(clientCLI(t, c), "req", "--raw", cp.ClientSubmit(cp.DefaultClient),
		`{"token_ids": [5, 17, 200, 31], "max_tokens": 6, "temperature": 0.7, "top_p": 0.9, "seed": 42}`,
		"-H", "Content-Type:application/json")...)
	if err != nil {
		t.Fatalf("nats req: %v\n%s", err, out)
	}
	var rep cp.SubmitReply
	if err := json.Unmarshal([]byte(lastLine(out)), &rep); err != nil || rep.JobID == "" {
		t.Fatalf("submit reply %q: %v", out, err)
	}
	for {
		out, err := natstest.CLI(ctx, t, c.URL, append(clientCLI(t, c), "req", "--raw", cp.ClientList(cp.DefaultClient), `{"limit": 10}`, "-H", "Content-Type:application/json")...)
		if err != nil {
			t.Fatalf("nats req list: %v\n%s", err, out)
		}
		var list cp.ListJobsReply
		if err := json.Unmarshal([]byte(lastLine(out)), &list); err != nil {
			t.Fatalf("list reply %q: %v", out, err)
		}
		for _, j := range list.Jobs {
			if j.JobID != rep.JobID || !j.State.Final() {
				continue
			}
			if j.State != cp.StateDone || j.Timing == nil || j.Timing.OutputTokens != 6 || j.Timing.PromptTokens != 4 {
				t.Fatalf("job %s: %+v", rep.JobID, j)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %s not done: %v", rep.JobID, list.Jobs)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// TestMalformedSubmissions: every malformed or inadmissible submission gets
// an error reply with the right code and a message naming the problem, and
// the coordinator goes on serving.
func TestMalformedSubmissions(t *testing.T) {
	opt := testOptions(t)
	opt.Coordinator.MaxPromptTokens = 64
	c := startCluster(t, opt)
	nc := connect(t, c)
	big := make([]string, 65)
	for i := range big {
		big[i] = "1"
	}
	for _, tc := range []struct {
		name, body string
		json       bool
		code       cp.ErrorCode
		want       string
	}{
		{"bad json", `{"prompt": `, true, cp.CodeBadRequest, "SubmitRequest"},
		{"json array", `[1, 2]`, true, cp.CodeBadRequest, "SubmitRequest"},
		{"bad msgpack", "\xc1\x00\xff", false, cp.CodeBadRequest, "SubmitRequest"},
		{"truncated msgpack", "\x81\xa9token_ids\x93\x01", false, cp.CodeBadRequest, "SubmitRequest"},
		{"wrong type", `{"token_ids": [1, 2], "max_tokens": "ten"}`, true, cp.CodeBadRequest, "max_tokens"},
		{"unknown field", `{"token_ids": [1, 2], "bogus": {"x": 1}}`, true, cp.CodeBadRequest, "bogus"},
		{"empty prompt", `{"prompt": ""}`, true, cp.CodeBadRequest, "empty prompt"},
		{"no prompt", `{"max_tokens": 5}`, true, cp.CodeBadRequest, "empty prompt"},
		{"negative max_tokens", `{"token_ids": [1], "max_tokens": -1}`, true, cp.CodeBadRequest, "max_tokens: is -1"},
		{"negative token", `{"token_ids": [1, -4]}`, true, cp.CodeBadRequest, "token_ids[1]"},
		{"token outside vocabulary", `{"token_ids": [1, 256]}`, true, cp.CodeBadRequest, "vocabulary [0, 256)"},
		{"text without tokenizer", `{"prompt": "hello"}`, true, cp.CodeBadRequest, "no tokenizer"},
		{"oversized prompt", `{"token_ids": [` + strings.Join(big, ",") + `]}`, true, cp.CodeTooLarge, "at most 64"},
		{"too many output tokens", `{"token_ids": [1], "max_tokens": 1000000}`, true, cp.CodeTooLarge, "max_tokens"},
		{"bad policy", `{"token_ids": [1], "policy": "fastest"}`, true, cp.CodeBadRequest, "policy"},
		{"nan temperature", `{"token_ids": [1], "temperature": 1e999}`, true, cp.CodeBadRequest, "temperature"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := nats.NewMsg(cp.ClientSubmit(cp.DefaultClient))
			m.Data = []byte(tc.body)
			enc := cp.MsgPack
			if tc.json {
				m.Header.Set(cp.HeaderContentType, cp.ContentTypeJSON)
				enc = cp.JSON
			}
			r, err := nc.RequestMsg(m, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var rep cp.SubmitReply
			if err := cp.Unmarshal(enc, r.Data, &rep); err != nil {
				t.Fatalf("reply %q: %v", r.Data, err)
			}
			if rep.Code != tc.code || !strings.Contains(rep.Error, tc.want) || rep.JobID != "" {
				t.Fatalf("reply %+v, want code %s and %q in the error", rep, tc.code, tc.want)
			}
			if strings.HasPrefix(rep.Error, string(rep.Code)+":") {
				t.Fatalf("the code is repeated in the text: %q", rep.Error)
			}
		})
	}
	// Still serving.
	res := run(t, nc, cp.SubmitRequest{TokenIDs: []int32{1, 2, 3}, Sampling: cp.Sampling{MaxTokens: 3}})
	if res.Final.State != cp.StateDone {
		t.Fatalf("after the bad submissions: %+v", res.Final)
	}
}

// TestRestartWithQueuedJobs: jobs wait in the queue (no decode group is
// up) while the coordinator stops cleanly, then while it crashes; a new
// coordinator runs every job exactly once.
func TestRestartWithQueuedJobs(t *testing.T) {
	opt := testOptions(t)
	opt.NoPrefill = true
	c := startCluster(t, opt)
	nc := connect(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Count every final event and token message of every job.
	var mu sync.Mutex
	finals := map[string]int{}
	tokens := map[string]map[int]int{}
	evSub, err := nc.Subscribe(cp.ClientAllJobEvents(cp.DefaultClient), func(m *nats.Msg) {
		var ev cp.JobEvent
		if _, err := cp.DecodeMsg(m, &ev); err == nil && ev.State.Final() {
			mu.Lock()
			finals[ev.JobID]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer evSub.Unsubscribe()
	tokSub, err := nc.Subscribe(cp.ClientAllJobTokens(cp.DefaultClient), func(m *nats.Msg) {
		var tm cp.TokenMsg
		if _, err := cp.DecodeMsg(m, &tm); err == nil {
			mu.Lock()
			if tokens[tm.JobID] == nil {
				tokens[tm.JobID] = map[int]int{}
			}
			tokens[tm.JobID][tm.Index]++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tokSub.Unsubscribe()

	for r := range c.Group.Layout.Ranks {
		if err := c.StopRank(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	submit := func(n int) []string {
		var ids []string
		for i := range n {
			rep, err := cp.Submit(ctx, nc, &cp.SubmitRequest{TokenIDs: testkit.Prompt(5, c.Model.VocabSize, 100+i+len(finals)), Sampling: cp.Sampling{MaxTokens: 4}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, rep.JobID)
		}
		return ids
	}
	ids := submit(4)
	// Delivered to the coordinator, which holds them waiting for a decode
	// group.
	waitQueue(ctx, t, c, queueCounts{InFlight: 4})
	if err := c.StopCoordinator(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartCoordinator(ctx); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, submit(4)...)
	// The four handed back by the clean stop and the four new ones, all
	// held by the new coordinator.
	waitQueue(ctx, t, c, queueCounts{InFlight: 8})
	c.KillCoordinator()
	if err := c.StartCoordinator(ctx); err != nil {
		t.Fatal(err)
	}
	for r := range c.Group.Layout.Ranks {
		if err := c.StartRank(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// Every job ends once, with each token published once. The crashed
	// coordinator's jobs come back after the queue's ack wait (3 s).
	for {
		mu.Lock()
		ended := 0
		for _, id := range ids {
			if finals[id] > 0 {
				ended++
			}
		}
		mu.Unlock()
		if ended == len(ids) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d jobs ended", ended, len(ids))
		case <-time.After(50 * time.Millisecond):
		}
	}
	// Nothing can run again once every delivery is acknowledged, and by
	// then every event and token of what ran has reached nc.
	waitSettled(ctx, t, c, nc)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if finals[id] != 1 {
			t.Errorf("job %s ended %d times", id, finals[id])
		}
		if len(tokens[id]) != 5 {
			t.Errorf("job %s: %d token messages, want 4 tokens and the final one", id, len(tokens[id]))
		}
		for i, n := range tokens[id] {
			if n != 1 {
				t.Errorf("job %s: token %d published %d times", id, i, n)
			}
		}
	}
	list, err := listJobs(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	done := 0
	for _, j := range list {
		if j.State == cp.StateDone {
			done++
		}
	}
	t.Logf("%d jobs done after a clean stop and a crash of the coordinator; the new coordinator lists %d of them", len(ids), done)
}

func listJobs(ctx context.Context, nc *nats.Conn) ([]cp.JobEvent, error) {
	var rep cp.ListJobsReply
	if err := cp.Request(ctx, nc, cp.ClientList(cp.DefaultClient), &cp.ListJobsRequest{}, &rep); err != nil {
		return nil, err
	}
	if err := rep.Err(); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	return rep.Jobs, nil
}
