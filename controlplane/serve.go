package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// Reply is a reply message that can carry an error instead of a result.
type Reply interface {
	Message
	SetError(code ErrorCode, text string)
}

// SetError turns r into an error reply.
func (r *SubmitReply) SetError(code ErrorCode, text string) {
	*r = SubmitReply{Error: text, Code: code}
}

// SetError turns r into an error reply.
func (r *CancelReply) SetError(code ErrorCode, text string) {
	*r = CancelReply{JobID: r.JobID, Error: text, Code: code}
}

// SetError turns r into an error reply.
func (r *ListJobsReply) SetError(code ErrorCode, text string) {
	*r = ListJobsReply{Error: text, Code: code}
}

// SetError turns r into a refusal.
func (r *AssignReply) SetError(code ErrorCode, text string) {
	*r = AssignReply{JobID: r.JobID, WorkerID: r.WorkerID, Error: text, Code: code}
}

// Serve answers requests on subject (in queue group queue, none when empty)
// with handle until ctx is done, then drains the subscription. Each request
// is answered as Answer does. Requests are handled one at a time on the
// subscription's goroutine: handle must not block for long.
func Serve[Req, Rep any, PReq interface {
	*Req
	Message
}, PRep interface {
	*Rep
	Reply
}](ctx context.Context, nc *nats.Conn, subject, queue string, handle func(context.Context, PReq) (PRep, error)) (*nats.Subscription, error) {
	return Subscribe(nc, subject, queue, ctx.Done(), func(m *nats.Msg) { Answer(ctx, m, handle) })
}

// Answer answers one request with handle. The request is decoded strictly
// in the encoding its Content-Type names and answered in the same encoding.
// A request that does not decode or validate is answered with
// CodeBadRequest and never reaches handle; an error from handle is answered
// with its *RemoteError code, CodeBadRequest for ErrInvalid, or
// CodeInternal. A message without a reply subject is ignored.
func Answer[Req, Rep any, PReq interface {
	*Req
	Message
}, PRep interface {
	*Rep
	Reply
}](ctx context.Context, m *nats.Msg, handle func(context.Context, PReq) (PRep, error)) {
	if m.Reply == "" {
		return // a publish, not a request: nobody to answer
	}
	var rep PRep
	req := PReq(new(Req))
	enc, err := DecodeMsg(m, req)
	if err == nil {
		rep, err = handle(context.WithValue(context.WithValue(ctx, subjectKey{}, m.Subject), encodingKey{}, enc), req)
		if err == nil && rep == nil {
			err = fmt.Errorf("handler for %s returned no reply", m.Subject)
		}
	}
	if err != nil {
		rep = PRep(new(Rep))
		rep.SetError(errorCode(err), err.Error())
	}
	if err := Respond(m, enc, rep); err != nil {
		// The reply itself is invalid (a handler bug): say so to the
		// requester rather than leave it waiting for a timeout.
		rep = PRep(new(Rep))
		rep.SetError(CodeInternal, err.Error())
		_ = Respond(m, enc, rep)
	}
}

// Refuse answers a request, without decoding it, with an error reply of
// rep's type in the request's encoding.
func Refuse(m *nats.Msg, rep Reply, code ErrorCode, text string) error {
	if m.Reply == "" {
		return nil
	}
	enc, _ := EncodingOf(m) // msgpack when the header is unusable
	rep.SetError(code, text)
	return Respond(m, enc, rep)
}

// Subscribe subscribes cb to subject (in queue group queue, none when
// empty), makes sure the server knows the subscription before it returns,
// and drains the subscription when done is closed.
func Subscribe(nc *nats.Conn, subject, queue string, done <-chan struct{}, cb nats.MsgHandler) (*nats.Subscription, error) {
	var sub *nats.Subscription
	var err error
	if queue != "" {
		sub, err = nc.QueueSubscribe(subject, queue, cb)
	} else {
		sub, err = nc.Subscribe(subject, cb)
	}
	if err != nil {
		return nil, fmt.Errorf("serve %s: %w", subject, err)
	}
	// Make sure the server knows the subscription before callers send.
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("serve %s: %w", subject, err)
	}
	go func() {
		<-done
		_ = sub.Drain()
	}()
	return sub, nil
}

type subjectKey struct{}

type encodingKey struct{}

// RequestEncoding is the encoding of the request a Serve handler was
// called for (msgpack outside a handler).
func RequestEncoding(ctx context.Context) Encoding {
	e, _ := ctx.Value(encodingKey{}).(Encoding)
	return e
}

// RequestSubject is the subject of the request a Serve handler was called
// for (e.g. which client's subject it came on); "" outside a handler.
func RequestSubject(ctx context.Context) string {
	s, _ := ctx.Value(subjectKey{}).(string)
	return s
}

func errorCode(err error) ErrorCode {
	var re *RemoteError
	switch {
	case errors.As(err, &re) && re.Code != "":
		return re.Code
	case errors.Is(err, ErrInvalid):
		return CodeBadRequest
	}
	return CodeInternal
}

// Flushed waits until the server has processed what nc sent so far, its
// subscriptions included. A worker registers only then, so that whoever
// finds it in the registry finds it serving.
func Flushed(nc *nats.Conn) error {
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("waiting for the NATS server to confirm the subscriptions: %w", err)
	}
	return nil
}
