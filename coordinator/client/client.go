// Package client submits a job to the coordinator and follows it: its
// events and its tokens, to the end. The CLI, the demo and the tests use
// it; any NATS client can do the same by following docs/PROTOCOL.md.
package client

import (
	"context"
	"errors"
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
	Text   string  // their text (empty for a model without tokenizer); of a chat: the response
	// Reasoning and Calls are a chat's think channel and tool calls.
	Reasoning string
	Calls     []cp.ToolCall
	Finish    cp.FinishReason
	// Submitted is when the client sent the submission.
	Submitted time.Time
	// Recovered: token messages were lost (the connection dropped), so
	// Tokens, Text and Finish come from the final event's output; the
	// handlers saw only the tokens before the loss.
	Recovered bool
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
	// Gap, when set, is told that the token messages from index from to
	// index to (exclusive) were lost while the connection was down. Token
	// goes on with the message of index to and those after it, as they
	// arrive; the Result has the whole output, from the final event
	// (Recovered).
	Gap func(from, to int)
}

// tailWait is how long the client waits, after the final event, for the
// final token message: the decode group publishes it before its last
// report, so it is normally there already; it is missing only when the
// decode group's front door died, or the connection dropped (the final
// event's output then has every token).
const tailWait = 500 * time.Millisecond

// attemptTimeout bounds one submission or status request; the client
// retries until its context ends.
const attemptTimeout = 5 * time.Second

// Run submits req as the connection's client, controlplane.ClientName, and
// follows the job until its final event and last token message, or until
// ctx ends; it returns an error when nc is closed. Without an idempotency
// key it makes one up, so that it knows the job's id and subscribes before
// the job can start, and it retries the submission while no coordinator
// answers or the answer is unavailable. Run survives any number of
// reconnections when nc has MaxReconnects < 0: it misses no final event,
// streams the tokens after those it missed to Handlers.Token, with
// Handlers.Gap saying which it missed, and the Result takes the whole
// output from the final event. A job that a stopping coordinator handed
// back runs again from its first token, and Run starts its tokens over.
func Run(ctx context.Context, nc *nats.Conn, req cp.SubmitRequest, h Handlers) (*Result, error) {
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = "client-" + cp.NewJobID()
	}
	// An invalid request is refused here, not retried until ctx ends.
	if err := req.Validate(); err != nil {
		return nil, err
	}
	client := cp.ClientName(nc)
	id := cp.JobIDForKey(client, req.IdempotencyKey)
	if nc.IsClosed() {
		return nil, fmt.Errorf("job %s: %w", id, nats.ErrConnectionClosed)
	}
	// Registered before anything else, so no reconnection is missed.
	status := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
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
	f := &follower{ctx: ctx, nc: nc, id: id, h: h, status: status, events: events, tokens: tokens,
		res: &Result{JobID: id, Submitted: time.Now()}}
	// The subscriptions must be in place at the server before the job can
	// start.
	if err := f.flush(); err != nil {
		return nil, err
	}
	if err := f.submit(&req); err != nil {
		return nil, err
	}
	return f.follow()
}

// follower is one client's view of its job.
type follower struct {
	ctx    context.Context
	nc     *nats.Conn
	id     string
	h      Handlers
	status chan nats.Status
	events chan *nats.Msg
	tokens chan *nats.Msg
	res    *Result

	text      strings.Builder
	reasoning strings.Builder
	final     bool // the final event arrived
	lastToken bool // the final token message arrived
	missed    bool // token messages were lost (the connection dropped)
	next      int  // the index of the next token message to stream
	resync    bool // a status request is due (after a reconnection)
	notStored bool // an attempt was answered not stored (its events may still arrive)
	retry     *time.Timer
	tail      <-chan time.Time
}

// flush waits until the server has the subscriptions, across reconnections.
func (f *follower) flush() error {
	for {
		err := f.nc.FlushTimeout(attemptTimeout)
		if err == nil {
			return nil
		}
		if err := f.wait(err); err != nil {
			return fmt.Errorf("job %s: subscribe: %w", f.id, err)
		}
	}
}

// submit sends the submission until a coordinator answers it. A refusal
// is final; no answer (no coordinator, a lost connection, a timeout) is
// retried, which the idempotency key makes safe.
func (f *follower) submit(req *cp.SubmitRequest) error {
	for {
		actx, cancel := context.WithTimeout(f.ctx, attemptTimeout)
		rep, err := cp.Submit(actx, f.nc, req)
		cancel()
		var re *cp.RemoteError
		switch {
		case err == nil:
			f.res.Duplicate = rep.Duplicate
			return nil
		case errors.As(err, &re) && re.Code != cp.CodeUnavailable:
			return err
		case errors.Is(err, nats.ErrMaxPayload):
			// Never sent: no retry would send it either.
			return fmt.Errorf("job %s: the submission is larger than the NATS server takes in one message (max_payload, %d bytes): send smaller images or a shorter prompt, or raise max_payload: %w",
				f.id, f.nc.MaxPayload(), err)
		}
		// Not stored (no coordinator, no capacity now, the queue did not
		// answer): what was published of this attempt (a failed event
		// saying it was not queued) is dropped, and the same submission
		// goes again.
		f.drainEvents()
		f.notStored = f.notStored || re != nil
		// An attempt whose answer was lost may have been stored and even
		// have ended: once one is answered, ask where the job is.
		f.resync = true
		if err := f.wait(err); err != nil {
			return fmt.Errorf("job %s: submit: %w", f.id, err)
		}
	}
}

// notQueued starts the message of the failed event a coordinator publishes
// for a submission it could not store (coordinator/service).
const notQueued = "not queued: "

// drainEvents drops the events received so far: they came before the
// answer to a submission that was not stored.
func (f *follower) drainEvents() {
	for {
		select {
		case <-f.events:
		default:
			return
		}
	}
}

// wait pauses before a retry after cause: until the connection comes back,
// or a short while. It fails when the context ended or the connection is
// closed.
func (f *follower) wait(cause error) error {
	t := time.NewTimer(250 * time.Millisecond)
	defer t.Stop()
	select {
	case <-f.ctx.Done():
		return fmt.Errorf("%w (last: %v)", f.ctx.Err(), cause)
	case s := <-f.status:
		if s == nats.CLOSED {
			return fmt.Errorf("%w (last: %v)", nats.ErrConnectionClosed, cause)
		}
	case <-t.C:
	}
	if f.nc.IsClosed() {
		return fmt.Errorf("%w (last: %v)", nats.ErrConnectionClosed, cause)
	}
	return nil
}

func (f *follower) follow() (*Result, error) {
	res := f.res
	f.retry = time.NewTimer(time.Hour)
	f.retry.Stop()
	defer f.retry.Stop()
	f.lookup() // after a retried submission
	for !f.final || !f.lastToken {
		select {
		case m := <-f.events:
			var ev cp.JobEvent
			if _, err := cp.DecodeMsg(m, &ev); err != nil {
				return res, fmt.Errorf("job %s: %w", f.id, err)
			}
			f.event(ev)
		case m := <-f.tokens:
			var t cp.TokenMsg
			if _, err := cp.DecodeMsg(m, &t); err != nil {
				return res, fmt.Errorf("job %s: %w", f.id, err)
			}
			f.token(t)
		case s := <-f.status:
			if s == nats.CLOSED {
				return res, fmt.Errorf("job %s: %w (%d events, %d tokens so far)", f.id, nats.ErrConnectionClosed, len(res.Events), len(res.Tokens))
			}
			// Reconnected: what was published meanwhile is lost to this
			// connection. Ask where the job is.
			f.resync = true
			f.lookup()
		case <-f.retry.C:
			f.lookup()
		case <-f.tail:
			f.lastToken = true // the decode group went away before its last message
		case <-f.ctx.Done():
			return res, fmt.Errorf("job %s: %w (%d events, %d tokens so far)", f.id, f.ctx.Err(), len(res.Events), len(res.Tokens))
		}
	}
	if out := res.Final.Output; out != nil && (f.missed || len(res.Tokens) != len(out.TokenIDs)) {
		// Token messages were lost: the final event has them all.
		res.Tokens, res.Finish, res.Recovered = append([]int32(nil), out.TokenIDs...), out.FinishReason, true
		f.text.Reset()
		f.text.WriteString(out.Text)
		f.reasoning.Reset()
		f.reasoning.WriteString(out.Reasoning)
		res.Calls = append([]cp.ToolCall(nil), out.ToolCalls...)
	}
	res.Text, res.Reasoning = f.text.String(), f.reasoning.String()
	return res, nil
}

// lookup asks a coordinator for the job's latest event after a
// reconnection, again every second until one answers.
func (f *follower) lookup() {
	if !f.resync || f.final {
		return
	}
	actx, cancel := context.WithTimeout(f.ctx, attemptTimeout)
	defer cancel()
	rep, err := cp.ListJobs(actx, f.nc, &cp.ListJobsRequest{JobID: f.id})
	if err != nil {
		f.retry.Reset(time.Second)
		return
	}
	f.resync = false
	for _, ev := range rep.Jobs {
		if ev.JobID == f.id && ev.State.Final() {
			f.event(ev)
		}
	}
}

func (f *follower) event(ev cp.JobEvent) {
	res := f.res
	if f.notStored && ev.State == cp.StateFailed && ev.Error != nil && strings.HasPrefix(ev.Error.Message, notQueued) {
		// The failed event of an attempt that was not stored, arriving
		// after its answer: the job is the retried one's.
		return
	}
	res.Events = append(res.Events, ev)
	if f.h.Event != nil {
		f.h.Event(ev)
	}
	if !ev.State.Final() || f.final {
		return
	}
	f.final, res.Final = true, ev
	switch {
	case ev.Output != nil && f.missed:
		f.lastToken = true // the output has every token
	case ev.Timing == nil || ev.Timing.FirstToken == 0:
		// A job that never decoded has no token messages (an adopted job
		// has no first-token time, but its output).
		if ev.Output == nil {
			f.lastToken = f.lastToken || ev.State != cp.StateDone
		}
	}
	f.tail = time.After(tailWait)
}

func (f *follower) token(t cp.TokenMsg) {
	res := f.res
	switch {
	case t.Index == 0 && f.next > 0:
		// The job runs again from the start (a stopping coordinator
		// handed it back): so do its tokens.
		res.Tokens, f.lastToken, f.missed, f.next = nil, false, false, 0
		f.text.Reset()
		f.reasoning.Reset()
		res.Calls = nil
	case t.Index < f.next:
		return // seen already
	case t.Index > f.next:
		// Messages were lost while the connection was down; the final
		// event's output will have them all. The stream goes on from
		// here.
		if f.h.Gap != nil {
			f.h.Gap(f.next, t.Index)
		}
		f.missed = true
	}
	f.next = t.Index + 1
	if f.missed {
		// Res gets the whole output from the final event; the handler
		// streams what arrives.
		if f.h.Token != nil {
			f.h.Token(t)
		}
		if t.Final {
			f.lastToken, res.Finish = true, t.FinishReason
		}
		return
	}
	if t.TokenID >= 0 {
		res.Tokens = append(res.Tokens, t.TokenID)
	}
	f.text.WriteString(t.Text)
	f.reasoning.WriteString(t.Reasoning)
	if c := t.Call; c != nil {
		if c.Index == len(res.Calls) {
			res.Calls = append(res.Calls, cp.ToolCall{Name: c.Name})
		}
		if c.Index < len(res.Calls) {
			res.Calls[c.Index].Arguments += c.Arguments
		}
	}
	if f.h.Token != nil {
		f.h.Token(t)
	}
	if t.Final {
		f.lastToken, res.Finish = true, t.FinishReason
	}
}
