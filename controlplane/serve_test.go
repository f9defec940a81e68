package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/tandem-inference/tandem/internal/natstest"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// serveSubmit runs a test responder on every client's submit subject: it accepts valid
// requests with their derived job id, refuses prompts over 8 tokens with
// CodeTooLarge, and fails (as a server bug would) for the prompt "boom".
func serveSubmit(t testing.TB, nc *nats.Conn) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, err := Serve(ctx, nc, SubjectAllSubmit, QueueGroupCoordinators, func(ctx context.Context, req *SubmitRequest) (*SubmitReply, error) {
		switch {
		case req.Prompt == "boom":
			return nil, errors.New("router exploded")
		case len(req.TokenIDs) > 8:
			return nil, &RemoteError{Code: CodeTooLarge, Message: "prompt has " + itoa(len(req.TokenIDs)) + " tokens, the limit is 8"}
		}
		client, err := ClientOf(RequestSubject(ctx))
		if err != nil {
			return nil, err
		}
		return &SubmitReply{JobID: JobIDFor(client, req)}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// rawRequest sends body with the given Content-Type (none when empty) and
// returns the reply.
func rawRequest(t testing.TB, nc *nats.Conn, contentType string, body []byte) *nats.Msg {
	t.Helper()
	m := nats.NewMsg(ClientSubmit(DefaultClient))
	if contentType != "" {
		m.Header.Set(HeaderContentType, contentType)
	}
	m.Data = body
	r, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	return r
}

func TestServeSubmit(t *testing.T) {
	serverKinds(t, security{}, func(t *testing.T, srv testServer) {
		nc := connect(t, Options{URL: srv.url})
		serveSubmit(t, nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()

		// msgpack, through the Go client.
		rep, err := Submit(ctx, nc, &SubmitRequest{TokenIDs: []int32{1, 2, 3}, IdempotencyKey: "abc"})
		if err != nil {
			t.Fatal(err)
		}
		if rep.JobID != JobIDForKey(DefaultClient, "abc") {
			t.Fatalf("job id %s, want %s", rep.JobID, JobIDForKey(DefaultClient, "abc"))
		}

		// JSON in, JSON out.
		r := rawRequest(t, nc, "application/json", []byte(`{"prompt":"hello","max_tokens":4}`))
		if ct := r.Header.Get(HeaderContentType); ct != ContentTypeJSON {
			t.Errorf("JSON request answered with Content-Type %q", ct)
		}
		var jr map[string]any
		if err := json.Unmarshal(r.Data, &jr); err != nil {
			t.Fatalf("JSON request answered with non-JSON %q: %v", r.Data, err)
		}
		if id, _ := jr["job_id"].(string); CheckID(id) != nil {
			t.Fatalf("JSON reply %s has no job id", r.Data)
		}

		// Refusals and failures carry a code, in the request's encoding.
		_, err = Submit(ctx, nc, &SubmitRequest{TokenIDs: make([]int32, 9)})
		var re *RemoteError
		if !errors.As(err, &re) || re.Code != CodeTooLarge || !strings.Contains(re.Message, "limit is 8") {
			t.Fatalf("oversized prompt: %v, want too_large with the limit", err)
		}
		_, err = Submit(ctx, nc, &SubmitRequest{Prompt: "boom"})
		if !errors.As(err, &re) || re.Code != CodeInternal || !strings.Contains(re.Message, "router exploded") {
			t.Fatalf("handler failure: %v, want internal with the cause", err)
		}
	})
}

// Every malformed submission gets an error reply in the request's encoding,
// and the responder keeps serving.
func TestServeAnswersMalformedRequests(t *testing.T) {
	srv := startEmbedded(t, security{})
	nc := connect(t, Options{URL: srv.url})
	serveSubmit(t, nc)
	mp := func(v any) []byte { b, _ := msgpack.Marshal(v); return b }
	for _, tc := range []struct {
		name, ct string
		body     []byte
		want     string
	}{
		{"bad json", "application/json", []byte(`{"prompt":`), "ends in the middle"},
		{"unknown field of the wrong type", "application/json", []byte(`{"prompt":"x","max_tokens":{}}`), "max_tokens"},
		{"unknown field", "application/json", []byte(`{"prompt":"x","colour":"red"}`), `unknown field "colour"`},
		{"empty prompt", "application/json", []byte(`{"prompt":""}`), "empty prompt"},
		{"negative max_tokens", "application/json", []byte(`{"prompt":"x","max_tokens":-5}`), "max_tokens: is -5"},
		{"empty body", "application/json", nil, "empty input"},
		{"bad msgpack", "", []byte{0x81, 0xa6, 'p', 'r', 'o', 'm', 'p', 't'}, "msgpack"},
		// Without a header, a body starting with '{' is JSON, answered as JSON.
		{"json without its header", "", []byte(`{"prompt":"x","colour":"red"}`), `unknown field "colour"`},
		{"json after white space, no header", "", []byte(" \r\n\t{\"prompt\":\"\"}"), "empty prompt"},
		{"neither json nor a map, no header", "", []byte(`[1]`), "want a map"},
		{"NaN temperature", "", mp(map[string]any{"prompt": "x", "temperature": math.NaN()}), "temperature: is NaN"},
		{"unsupported content type", "text/plain", []byte("hello"), "not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rawRequest(t, nc, tc.ct, tc.body)
			enc, _ := ParseContentType(tc.ct)
			if tc.ct == "" {
				enc = Sniff(tc.body)
			}
			if got, _ := ParseContentType(r.Header.Get(HeaderContentType)); got != enc {
				t.Fatalf("reply in %s, want %s", got, enc)
			}
			var rep SubmitReply
			if err := Unmarshal(enc, r.Data, &rep); err != nil {
				t.Fatalf("reply %q does not decode as %s: %v", r.Data, enc, err)
			}
			if rep.Code != CodeBadRequest || !strings.Contains(rep.Error, tc.want) {
				t.Fatalf("reply %+v, want bad_request mentioning %q", rep, tc.want)
			}
		})
	}
	// Still serving.
	if _, err := Submit(context.Background(), nc, &SubmitRequest{Prompt: "ok"}); err != nil {
		t.Fatalf("responder stopped after malformed requests: %v", err)
	}
}

func TestServeStopsWithContext(t *testing.T) {
	srv := startEmbedded(t, security{})
	nc := connect(t, Options{URL: srv.url})
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := Serve(ctx, nc, ClientCancel(DefaultClient), "", func(_ context.Context, req *CancelRequest) (*CancelReply, error) {
		return &CancelReply{JobID: req.JobID, State: StateCancelled}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := Cancel(context.Background(), nc, "j-1", "test"); err != nil || rep.State != StateCancelled {
		t.Fatalf("cancel: %+v, %v", rep, err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for sub.IsValid() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer rcancel()
	_, err = Cancel(rctx, nc, "j-1", "")
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("after the serve context ended: %v, want no responders", err)
	}
}

// natsCLI runs the pinned nats CLI against url (with a private home, so no
// user context file changes what it does).
func natsCLI(t *testing.T, url string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return natstest.CLI(ctx, t, url, append([]string{"--timeout", "5s"}, args...)...)
}

// Any NATS client can submit: the real nats CLI sends JSON with the
// Content-Type header and gets JSON back.
func TestNatsCLISubmitsJSON(t *testing.T) {
	serverKinds(t, security{}, func(t *testing.T, srv testServer) {
		nc := connect(t, Options{URL: srv.url})
		serveSubmit(t, nc)
		out, err := natsCLI(t, srv.url, "req", "--raw", ClientSubmit("cli"),
			`{"prompt":"Hello from the CLI","max_tokens":8,"temperature":0,"stop":["\n"],"idempotency_key":"cli-1"}`,
			"-H", "Content-Type:application/json")
		if err != nil {
			t.Fatalf("nats req: %v\n%s", err, out)
		}
		var rep SubmitReply
		if err := Unmarshal(JSON, []byte(strings.TrimSpace(out)), &rep); err != nil {
			t.Fatalf("CLI got %q, not a JSON SubmitReply: %v", out, err)
		}
		if rep.JobID != JobIDForKey("cli", "cli-1") {
			t.Fatalf("CLI reply %+v, want job %s", rep, JobIDForKey("cli", "cli-1"))
		}

		out, err = natsCLI(t, srv.url, "req", "--raw", ClientSubmit("cli"), `{"prompt":"x","max_tokens":-1}`, "-H", "Content-Type:application/json")
		if err != nil {
			t.Fatalf("nats req: %v\n%s", err, out)
		}
		rep = SubmitReply{}
		if err := Unmarshal(JSON, []byte(strings.TrimSpace(out)), &rep); err != nil || rep.Code != CodeBadRequest {
			t.Fatalf("CLI bad request got %q (%v), want a JSON bad_request reply", out, err)
		}
	})
}

// TestCheckClientReply: a client request may be answered only on the asking
// client's own inbox, a plain subject under it.
func TestCheckClientReply(t *testing.T) {
	for _, tc := range []struct {
		subject, reply string
		ok             bool
	}{
		{ClientSubmit("alice"), "_INBOX.client.alice.abc.1", true},
		{ClientList("alice"), "_INBOX.client.alice.x", true},
		{ClientCancel("alice"), "_INBOX.client.bob.x", false},
		{ClientSubmit("alice"), "_INBOX.client.alice", false},
		{ClientSubmit("alice"), "_INBOX.client.alice.", false},
		{ClientSubmit("alice"), "_INBOX.client.alicex.y", false},
		{ClientSubmit("alice"), "_INBOX.client.alice.*", false},
		{ClientSubmit("alice"), "_INBOX.client.alice.>", false},
		{ClientSubmit("alice"), "_INBOX.client.alice.a..b", false},
		{ClientSubmit("alice"), "_INBOX.client.alice.a b", false},
		{ClientAvailability("alice"), "$JS.API.STREAM.PURGE." + JobsStream, false},
		{ClientSubmit("alice"), HeartbeatSubject("w1"), false},
		{ClientSubmit("alice"), "_INBOX.abc", false},
		{WorkerAssign("w1"), "_INBOX.client.alice.x", false},
	} {
		if err := CheckClientReply(tc.subject, tc.reply); (err == nil) != tc.ok {
			t.Errorf("CheckClientReply(%q, %q) = %v, want ok %v", tc.subject, tc.reply, err, tc.ok)
		}
	}
}
