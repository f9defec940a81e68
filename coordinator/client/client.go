// Package client submits a job to the coordinator and follows it: its
// events and its tokens, to the end. The CLI, the demo and the tests use
// it; any NATS client can do the same by following docs/PROTOCOL.md.
package client

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// Result is a finished job as its client saw it.
type Result struct {
	JobID     string
	Duplicate bool
	// Final is the job's final event (state, route, timing, error).
	Final  cp.JobEvent
	Events []cp.JobEvent
	Tokens []int32 // generated token ids, in order
	Text   string  // their text (empty for a model without tokenizer)
	Finish cp.FinishReason
	// Submitted is when the client sent the submission.
	Submitted time.Time
}

// Err is the job's failure as an error (nil unless it failed).
func (r *Result) Err() error {
	if r.Final.State != cp.StateFailed || r.Final.Error == nil {
		return nil
	}
	return fmt.Errorf("job %s failed: %w", r.JobID, r.Final.Error)
}

// Handlers are called as the job's messages arrive, from one goroutine.
type Handlers struct {
	Event func(cp.JobEvent)
	Token func(cp.TokenMsg)
}

// tailWait is how long the client waits, after the final event, for the
// final token message: the decode group publishes it before its last
// report, so it is normally there already; it is missing only when the
// decode group's front door died.
const tailWait = 500 * time.Millisecond

// Run submits req as the connection's client (controlplane.ClientName) and
// follows the job until its final event (and its last
// token message), or until ctx ends. A job handed back to the queue by a
// stopping coordinator runs again from the start; Run then starts its
// tokens over. Without an idempotency key it makes
// one up, so that it knows the job's id and can subscribe to the job's
// subjects before the job can start; retrying with the same request is
// then safe.
func Run(ctx context.Context, nc *nats.Conn, req cp.SubmitRequest, h Handlers) (*Result, error) {
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = "client-" + cp.NewJobID()
	}
	client := cp.ClientName(nc)
	id := cp.JobIDForKey(client, req.IdempotencyKey)
	events := make(chan *nats.Msg, 1024)
	tokens := make(chan *nats.Msg, 4096)
	es, err := nc.ChanSubscribe(cp.ClientJobEvents(client, id), events)
	if err != nil {
		return nil, fmt.Errorf("job %s: subscribe to events: %w", id, err)
	}
	defer func() { _ = es.Unsubscribe() }()
	ts, err := nc.ChanSubscribe(cp.ClientJobTokens(client, id), tokens)
	if err != nil {
		return nil, fmt.Errorf("job %s: subscribe to tokens: %w", id, err)
	}
	defer func() { _ = ts.Unsubscribe() }()
	for _, s := range []*nats.Subscription{es, ts} {
		_ = s.SetPendingLimits(-1, -1) // a long job's tokens must not be dropped
	}
	// The subscriptions must be in place at the server before the job can
	// start.
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		return nil, fmt.Errorf("job %s: subscribe: %w", id, err)
	}
	res := &Result{JobID: id, Submitted: time.Now()}
	rep, err := cp.Submit(ctx, nc, &req)
	if err != nil {
		return nil, err
	}
	res.Duplicate = rep.Duplicate

	var text strings.Builder
	var final bool     // the final event arrived
	var lastToken bool // the final token message arrived
	var tail <-chan time.Time
	for !final || !lastToken {
		select {
		case m := <-events:
			var ev cp.JobEvent
			if _, err := cp.DecodeMsg(m, &ev); err != nil {
				return res, fmt.Errorf("job %s: %w", id, err)
			}
			if n := len(res.Events); n > 0 && ev.Seq <= res.Events[n-1].Seq {
				// A stopped coordinator handed the job back and it runs
				// again from the start: so do its tokens.
				res.Tokens, lastToken = nil, false
				text.Reset()
			}
			res.Events = append(res.Events, ev)
			if h.Event != nil {
				h.Event(ev)
			}
			if ev.State.Final() && !final {
				final, res.Final = true, ev
				// A job that never decoded has no token messages.
				if ev.Timing == nil || ev.Timing.FirstToken == 0 {
					lastToken = lastToken || ev.State != cp.StateDone
				}
				tail = time.After(tailWait)
			}
		case m := <-tokens:
			var t cp.TokenMsg
			if _, err := cp.DecodeMsg(m, &t); err != nil {
				return res, fmt.Errorf("job %s: %w", id, err)
			}
			if t.Index == 0 && len(res.Tokens) > 0 {
				res.Tokens, lastToken = nil, false // the job runs again
				text.Reset()
			}
			if t.Index != len(res.Tokens) {
				return res, fmt.Errorf("job %s: token message %d after %d tokens (lost messages)", id, t.Index, len(res.Tokens))
			}
			if t.TokenID >= 0 {
				res.Tokens = append(res.Tokens, t.TokenID)
			}
			text.WriteString(t.Text)
			if h.Token != nil {
				h.Token(t)
			}
			if t.Final {
				lastToken, res.Finish = true, t.FinishReason
			}
		case <-tail:
			lastToken = true // the decode group went away before its last message
		case <-ctx.Done():
			return res, fmt.Errorf("job %s: %w (%d events, %d tokens so far)", id, ctx.Err(), len(res.Events), len(res.Tokens))
		}
	}
	res.Text = text.String()
	return res, nil
}
