package openai_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/cluster"
	"github.com/tandem-inference/tandem/coordinator/openai"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/coordinator/service"
	"github.com/tandem-inference/tandem/internal/testkit"
	"github.com/tandem-inference/tandem/internal/testmodel"
	"github.com/tandem-inference/tandem/tokenizer"
)

const modelName = "demo-model"

// deployment is a whole cluster on the synthetic demo model (it has a
// tokenizer) with a front door on a loopback port.
type deployment struct {
	c    *cluster.Cluster
	url  string // http://127.0.0.1:PORT
	addr string
	srv  *openai.Server
	nc   *nats.Conn // the front door's
}

func startDeployment(t *testing.T, mod func(*openai.Config)) *deployment {
	t.Helper()
	return startDeploymentWith(t, nil, mod)
}

// startDeploymentWith is startDeployment with the cluster's options changed
// by modCluster first.
func startDeploymentWith(t *testing.T, modCluster func(*cluster.Options), mod func(*openai.Config)) *deployment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opt := cluster.Options{
		ModelDir: testmodel.Dir(t, "demo", 1, 2),
		Queue:    cp.QueueConfig{Memory: true},
		Registry: cp.RegistryConfig{Memory: true, TTL: 3 * time.Second},
		// No cap on the jobs the coordinator drives: all 200 of
		// TestConcurrentStreams are assigned at once and the decode group
		// admits them together. An admission is a trip around the ring
		// behind the steps in flight (up to MicroBatches decode and as
		// many prefill steps per rank); on this 2-core machine at load
		// 50+ that passed the default 10 s assignment timeout.
		Coordinator: service.Config{AssignTimeout: time.Minute, Rates: router.Rates{PassFloor: 20 * time.Millisecond,
			LinkBytesPerS: 1e9, DecodeStep: 2 * time.Millisecond}, SeedPrefillTokPerS: 3000, SeedLocalTokPerS: 2500},
		Threads: 1, Log: testkit.Logger(t),
	}
	if modCluster != nil {
		modCluster(&opt)
	}
	c, err := cluster.Start(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Logf("cluster close: %v", err)
		}
	})
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := c.Connect(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := openai.Config{Conn: nc, Model: c.Model, Tokenizer: c.Tokenizer, ModelName: modelName, Log: testkit.Logger(t)}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := openai.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeListener(sctx, ln, nil) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	d := &deployment{c: c, url: "http://" + ln.Addr().String(), addr: ln.Addr().String(), srv: srv, nc: nc}
	d.waitHealth(t, http.StatusOK)
	return d
}

// waitHealth waits until /health answers status (the front door has seen
// the registry).
func (d *deployment) waitHealth(t *testing.T, status int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(d.url + "/health")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == status {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health did not answer %d in 30s (last: %v %v)", status, resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func post(t *testing.T, url, key string, body any) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role      string  `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Tandem struct {
		JobID  string `json:"job_id"`
		Route  string `json:"route"`
		TTFTMs float64
		Timing *struct {
			FirstTokenMs float64 `json:"first_token_ms"`
		} `json:"timing"`
	} `json:"tandem"`
}

func decode[T any](t *testing.T, resp *http.Response) T {
	t.Helper()
	defer resp.Body.Close()
	var v T
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return v
}

// stream is a streamed response read event by event.
type stream struct {
	jobID   string
	content string
	calls   map[int]*call
	finish  string
	usage   map[string]int
	tandem  map[string]any
	done    bool
	chunks  int
}

type call struct{ id, name, args string }

func readStream(t *testing.T, resp *http.Response) *stream {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	s := &stream{jobID: resp.Header.Get("X-Tandem-Job-Id"), calls: map[int]*call{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	role := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if s.done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		if data == "[DONE]" {
			s.done = true
			continue
		}
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Role      string  `json:"role"`
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage  map[string]int `json:"usage"`
			Tandem map[string]any `json:"tandem"`
			Error  any            `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if ch.Error != nil {
			t.Fatalf("error event: %s", data)
		}
		s.chunks++
		if ch.Usage != nil {
			s.usage = ch.Usage
		}
		if ch.Tandem != nil {
			s.tandem = ch.Tandem
		}
		for _, c := range ch.Choices {
			if c.Delta.Role == "assistant" {
				if role || s.chunks != 1 {
					t.Fatalf("the role delta is not the first chunk, or comes twice")
				}
				role = true
			}
			if c.Delta.Content != nil {
				s.content += *c.Delta.Content
			}
			s.content += c.Text
			for _, tc := range c.Delta.ToolCalls {
				cl := s.calls[tc.Index]
				if cl == nil {
					if tc.ID == "" || tc.Function.Name == "" {
						t.Fatalf("a call's first delta has no id or name: %s", data)
					}
					cl = &call{id: tc.ID, name: tc.Function.Name}
					s.calls[tc.Index] = cl
				}
				cl.args += tc.Function.Arguments
			}
			if c.FinishReason != nil {
				if s.finish != "" {
					t.Fatalf("two finish reasons")
				}
				s.finish = *c.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !s.done || s.finish == "" {
		t.Fatalf("stream ended without [DONE] (%v) or a finish reason (%q)", s.done, s.finish)
	}
	return s
}

func chatBody(content string, stream bool, maxTokens int) map[string]any {
	return map[string]any{"model": modelName, "stream": stream, "max_tokens": maxTokens, "temperature": 0,
		"messages": []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}}}
}

// TestChatStreamedAndNot: the same greedy chat streamed and not gives the
// same text, exact usage (the prompt as the chat format frames it, every
// generated token), a finish reason, tandem's figures in the headers and
// the final object; a text completion too.
func TestChatStreamedAndNot(t *testing.T) {
	d := startDeployment(t, nil)
	whole := post(t, d.url+"/v1/chat/completions", "", chatBody("Why split prefill and decode?", false, 12))
	if whole.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(whole.Body)
		t.Fatalf("status %d: %s", whole.StatusCode, b)
	}
	for _, h := range []string{"X-Tandem-Job-Id", "X-Tandem-Route", "X-Tandem-Predicted-Ttft-Local-Ms", "X-Tandem-Ttft-Ms", "X-Tandem-Total-Ms"} {
		if whole.Header.Get(h) == "" {
			t.Errorf("header %s missing", h)
		}
	}
	c := decode[completion](t, whole)
	prompt, err := d.c.Tokenizer.EncodeChat(&tokenizer.Chat{Messages: []tokenizer.ChatMessage{tokenizer.Text("system", "Be brief."),
		tokenizer.Text("user", "Why split prefill and decode?")}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Object != "chat.completion" || c.Model != modelName || len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" {
		t.Fatalf("completion %+v", c)
	}
	if c.Usage.PromptTokens != len(prompt) || c.Usage.CompletionTokens < 1 || c.Usage.CompletionTokens > 12 ||
		c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
		t.Fatalf("usage %+v, want %d prompt tokens", c.Usage, len(prompt))
	}
	if f := c.Choices[0].FinishReason; !(f == "length" && c.Usage.CompletionTokens == 12 || f == "stop") {
		t.Fatalf("finish %q after %d tokens", f, c.Usage.CompletionTokens)
	}
	if c.Tandem.JobID == "" || c.Tandem.Route == "" || c.Tandem.Timing == nil || c.Tandem.Timing.FirstTokenMs <= 0 {
		t.Fatalf("tandem %+v", c.Tandem)
	}

	s := readStream(t, post(t, d.url+"/v1/chat/completions", "", func() map[string]any {
		b := chatBody("Why split prefill and decode?", true, 12)
		b["stream_options"] = map[string]any{"include_usage": true}
		return b
	}()))
	if s.content != *c.Choices[0].Message.Content || s.finish != c.Choices[0].FinishReason {
		t.Fatalf("streamed %q (%s), whole %q (%s)", s.content, s.finish, *c.Choices[0].Message.Content, c.Choices[0].FinishReason)
	}
	if s.usage["prompt_tokens"] != c.Usage.PromptTokens || s.usage["completion_tokens"] != c.Usage.CompletionTokens {
		t.Fatalf("streamed usage %v, whole %+v", s.usage, c.Usage)
	}
	if s.tandem["job_id"] != s.jobID || s.jobID == "" {
		t.Fatalf("tandem %v, job header %q", s.tandem, s.jobID)
	}

	// A text completion: the prompt as text, or as token ids.
	ids := d.c.Tokenizer.Encode("Prefill where the compute is")
	var texts []string
	for _, p := range []any{"Prefill where the compute is", ids} {
		tc := decode[completion](t, post(t, d.url+"/v1/completions", "", map[string]any{"model": modelName, "prompt": p,
			"max_tokens": 6, "temperature": 0}))
		if len(tc.Choices) != 1 || tc.Object != "text_completion" || tc.Usage.PromptTokens != len(ids) || tc.Usage.CompletionTokens != 6 {
			t.Fatalf("completion %+v", tc)
		}
		texts = append(texts, tc.Choices[0].Text)
	}
	if texts[0] != texts[1] {
		t.Fatalf("text and ids prompts differ: %q %q", texts[0], texts[1])
	}
	ts := readStream(t, post(t, d.url+"/v1/completions", "", map[string]any{"model": modelName, "prompt": ids,
		"max_tokens": 6, "temperature": 0, "stream": true}))
	if ts.content != texts[0] || ts.finish != "length" {
		t.Fatalf("streamed completion %q %s, whole %q", ts.content, ts.finish, texts[0])
	}

	models := decode[struct {
		Data []struct {
			ID            string `json:"id"`
			ContextLength int    `json:"context_length"`
		} `json:"data"`
	}](t, must(http.Get(d.url+"/v1/models")))
	if len(models.Data) != 1 || models.Data[0].ID != modelName || models.Data[0].ContextLength != d.c.Model.MaxPositions {
		t.Fatalf("models %+v", models)
	}
}

func must(r *http.Response, err error) *http.Response {
	if err != nil {
		panic(err)
	}
	return r
}

// TestToolHistoryRendered: a call and its result go back in as the next
// turn's history, rendered in K3's released format (usage counts exactly
// that prompt).
func TestToolHistoryRendered(t *testing.T) {
	d := startDeployment(t, nil)
	tool := map[string]any{"type": "function", "function": map[string]any{"name": "get_weather",
		"description": "Current weather", "parameters": map[string]any{"type": "object",
			"properties": map[string]any{"city": map[string]any{"type": "string"}}}}}
	body := map[string]any{"model": modelName, "max_tokens": 4, "temperature": 0, "tools": []any{tool},
		"messages": []map[string]any{{"role": "user", "content": "Weather in Paris?"},
			{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": "call_7", "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`}}}},
			{"role": "tool", "tool_call_id": "call_7", "content": `{"temp_c": 21}`}}}
	r := decode[completion](t, post(t, d.url+"/v1/chat/completions", "", body))
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	var chat tokenizer.Chat
	if err := json.Unmarshal(raw, &chat); err != nil {
		t.Fatal(err)
	}
	want, err := d.c.Tokenizer.EncodeChat(&chat)
	if err != nil {
		t.Fatal(err)
	}
	if r.Usage.PromptTokens != len(want) {
		t.Fatalf("the tool round's prompt has %d tokens, its rendering %d", r.Usage.PromptTokens, len(want))
	}
}

// TestErrors: every refusal in OpenAI's error shape with its status.
func TestErrors(t *testing.T) {
	d := startDeployment(t, func(c *openai.Config) {
		c.APIKeys = []string{"sk-good"}
		c.MaxBodyBytes = 64 << 10
		c.MaxPromptTokens = 500
		c.MaxConcurrentPerKey = 1
	})
	long := strings.Repeat("tandem ", 2000)
	for _, tc := range []struct {
		name   string
		key    string
		path   string
		body   any
		status int
		code   string
	}{
		{"no key", "", "/v1/chat/completions", chatBody("hi", false, 2), 401, "invalid_api_key"},
		{"bad key", "sk-bad", "/v1/chat/completions", chatBody("hi", false, 2), 401, "invalid_api_key"},
		{"unknown model", "sk-good", "/v1/chat/completions", map[string]any{"model": "gpt-4", "messages": []any{map[string]any{"role": "user", "content": "hi"}}}, 404, "model_not_found"},
		{"n=2", "sk-good", "/v1/chat/completions", map[string]any{"model": modelName, "n": 2, "messages": []any{map[string]any{"role": "user", "content": "hi"}}}, 400, "invalid_value"},
		{"bad role", "sk-good", "/v1/chat/completions", map[string]any{"model": modelName, "messages": []any{map[string]any{"role": "robot", "content": "hi"}}}, 400, "invalid_value"},
		{"bad json", "sk-good", "/v1/chat/completions", json.RawMessage(`{"model": 5}`), 400, "invalid_value"},
		{"temperature", "sk-good", "/v1/chat/completions", map[string]any{"model": modelName, "temperature": 3, "messages": []any{map[string]any{"role": "user", "content": "hi"}}}, 400, "invalid_value"},
		{"image", "sk-good", "/v1/chat/completions", map[string]any{"model": modelName, "messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "image_url"}}}}}, 400, "invalid_value"},
		{"prompt too long", "sk-good", "/v1/chat/completions", chatBody(long[:6000], false, 2), 413, "context_length_exceeded"},
		{"body too large", "sk-good", "/v1/chat/completions", chatBody(long+long+long+long+long, false, 2), 413, "request_too_large"},
		{"output too long", "sk-good", "/v1/completions", map[string]any{"model": modelName, "prompt": "hi", "max_tokens": 1 << 19}, 413, "context_length_exceeded"},
		{"unknown route", "sk-good", "/v1/embeddings", map[string]any{}, 404, "unknown_url"},
	} {
		resp := post(t, d.url+tc.path, tc.key, tc.body)
		e := decode[struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    string `json:"code"`
			} `json:"error"`
		}](t, resp)
		if resp.StatusCode != tc.status || e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s: status %d %+v, want %d %s", tc.name, resp.StatusCode, e.Error, tc.status, tc.code)
		}
	}

	// 429: the key's one slot is held by a stream in progress.
	held := post(t, d.url+"/v1/chat/completions", "sk-good", chatBody("hold", true, 200))
	if held.StatusCode != http.StatusOK {
		t.Fatalf("held stream: %d", held.StatusCode)
	}
	resp := post(t, d.url+"/v1/chat/completions", "sk-good", chatBody("hi", false, 2))
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second request with a held key: %d, want 429", resp.StatusCode)
	}
	held.Body.Close()

	// 503: no decode group serves the model.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for r := range 2 {
		if err := d.c.StopRank(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	d.waitHealth(t, http.StatusServiceUnavailable)
	resp = post(t, d.url+"/v1/chat/completions", "sk-good", chatBody("hi", false, 2))
	resp.Body.Close()
	// The held stream's slot is freed once its handler saw the client go.
	for deadline := time.Now().Add(30 * time.Second); resp.StatusCode == http.StatusTooManyRequests && time.Now().Before(deadline); {
		resp = post(t, d.url+"/v1/chat/completions", "sk-good", chatBody("hi", false, 2))
		resp.Body.Close()
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("no workers: %d, want 503", resp.StatusCode)
	}
}

// TestListenNeedsKeys: beyond loopback the front door refuses to start
// without keys.
func TestListenNeedsKeys(t *testing.T) {
	for _, tc := range []struct {
		addr string
		keys []string
		ok   bool
	}{
		{"127.0.0.1:8000", nil, true}, {"localhost:8000", nil, true}, {"[::1]:8000", nil, true},
		{"0.0.0.0:8000", nil, false}, {":8000", nil, false}, {"10.1.2.3:8000", nil, false},
		{"0.0.0.0:8000", []string{"k"}, true}, {"nonsense", nil, false},
	} {
		if err := openai.CheckListen(tc.addr, tc.keys); (err == nil) != tc.ok {
			t.Errorf("%s keys %v: err %v", tc.addr, tc.keys, err)
		}
	}
}

// TestDisconnectCancelsJob: a client that leaves mid-stream cancels its
// job: the job ends cancelled and every decode rank frees its sequence and
// its memory.
func TestDisconnectCancelsJob(t *testing.T) {
	d := startDeployment(t, nil)
	nc, err := d.c.Connect(context.Background(), "watch")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	events := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(cp.ClientAllJobEvents(cp.ClientName(d.nc)), events)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(chatBody("Tell me a very long story.", true, 2000))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+"/v1/chat/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	jobID := resp.Header.Get("X-Tandem-Job-Id")
	// Read until the job is decoding (a few chunks in), then leave.
	sc := bufio.NewScanner(resp.Body)
	for n := 0; n < 4 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") {
			n++
		}
	}
	cancel()
	resp.Body.Close()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case m := <-events:
			var ev cp.JobEvent
			if _, err := cp.DecodeMsg(m, &ev); err != nil || ev.JobID != jobID || !ev.State.Final() {
				continue
			}
			if ev.State != cp.StateCancelled {
				t.Fatalf("job %s ended %s, want cancelled", jobID, ev.State)
			}
			// Every rank lets go of the sequence and its memory.
			for r := range d.c.Group.Layout.Ranks {
				for {
					st := d.c.Group.Worker(r).Stats()
					if st.Sequences == 0 && st.ReservedBytes == 0 {
						break
					}
					select {
					case <-deadline:
						t.Fatalf("rank %d still holds %d sequences, %d bytes", r, st.Sequences, st.ReservedBytes)
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			return
		case <-deadline:
			t.Fatalf("job %s did not end after its client left", jobID)
		}
	}
}

// TestConcurrentStreams: 200 streamed requests at once all complete, and
// each stream carries exactly its own job's tokens (as the decode group
// published them on NATS, read back by the same parser).
func TestConcurrentStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("200 jobs; -short")
	}
	const n = 200
	d := startDeployment(t, func(c *openai.Config) { c.MaxConcurrentPerKey = n })
	nc, err := d.c.Connect(context.Background(), "watch")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	published := map[string][]int32{}
	sub, err := nc.Subscribe(cp.ClientAllJobTokens(cp.ClientName(d.nc)), func(m *nats.Msg) {
		var tm cp.TokenMsg
		if _, err := cp.DecodeMsg(m, &tm); err != nil || tm.TokenID < 0 {
			return
		}
		mu.Lock()
		published[tm.JobID] = append(published[tm.JobID], tm.TokenID)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	results := make([]*stream, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := chatBody(fmt.Sprintf("Request number %d: say something.", i), true, 6)
			body["temperature"] = 0.8
			body["seed"] = i
			body["stream_options"] = map[string]any{"include_usage": true}
			b, _ := json.Marshal(body)
			resp, err := http.Post(d.url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				errs <- err
				return
			}
			results[i] = readStreamErr(resp, errs)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	jobs := map[string]bool{}
	for i, s := range results {
		if s == nil {
			t.Fatalf("request %d: no stream", i)
		}
		if jobs[s.jobID] {
			t.Fatalf("request %d: job %s answers two requests", i, s.jobID)
		}
		jobs[s.jobID] = true
		mu.Lock()
		toks := published[s.jobID]
		mu.Unlock()
		p := d.c.Tokenizer.NewReplyParser(tokenizer.ReplyOptions{Thinking: true})
		var want strings.Builder
		for _, id := range toks {
			want.WriteString(p.Push(int(id)).Content)
		}
		want.WriteString(p.Finish().Content)
		if s.content != want.String() || s.usage["completion_tokens"] != len(toks) || len(toks) == 0 {
			t.Fatalf("request %d (job %s): streamed %q with %d tokens; the job published %d tokens reading %q",
				i, s.jobID, s.content, s.usage["completion_tokens"], len(toks), want.String())
		}
	}
}

// readStreamErr is readStream for goroutines other than the test's.
func readStreamErr(resp *http.Response, errs chan<- error) *stream {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		errs <- fmt.Errorf("status %d: %s", resp.StatusCode, b)
		return nil
	}
	s := &stream{jobID: resp.Header.Get("X-Tandem-Job-Id"), calls: map[int]*call{}}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			s.done = true
			break
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]int `json:"usage"`
			Error any            `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil || ch.Error != nil {
			errs <- fmt.Errorf("chunk %s: %v", data, err)
			return nil
		}
		if ch.Usage != nil {
			s.usage = ch.Usage
		}
		for _, c := range ch.Choices {
			s.content += c.Delta.Content
			if c.FinishReason != nil {
				s.finish = *c.FinishReason
			}
		}
	}
	if !s.done || s.finish == "" || s.usage == nil {
		errs <- fmt.Errorf("job %s: stream ended early (done %v finish %q usage %v)", s.jobID, s.done, s.finish, s.usage)
		return nil
	}
	return s
}
