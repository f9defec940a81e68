package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// DefaultRequestTimeout bounds a request whose context has no deadline.
const DefaultRequestTimeout = 10 * time.Second

// EncodingOf returns the encoding of a NATS message: the one its
// Content-Type header names, else JSON when the payload starts (after JSON
// white space) with '{', else msgpack. The sniff is unambiguous: every
// message is a msgpack map, whose first byte is 0x80-0x8f, 0xde or 0xdf,
// while '{' and the white space bytes are msgpack integers, never a
// message; so a JSON body from a tool that sets no headers (the nats CLI
// without -H) is read, and answered, as JSON.
func EncodingOf(m *nats.Msg) (Encoding, error) {
	if ct := m.Header.Get(HeaderContentType); ct != "" {
		return ParseContentType(ct)
	}
	return Sniff(m.Data), nil
}

// Sniff is the encoding of a payload without a Content-Type header.
func Sniff(data []byte) Encoding {
	i := 0
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	if i < len(data) && data[i] == '{' {
		return JSON
	}
	return MsgPack
}

// DecodeMsg decodes and validates m's payload into v, in the encoding its
// header names, and returns that encoding so the reply can use it. On error
// the encoding is still the one to answer in (msgpack when the header itself
// is unusable).
func DecodeMsg(m *nats.Msg, v Message) (Encoding, error) {
	enc, err := EncodingOf(m)
	if err != nil {
		return enc, err
	}
	return enc, Unmarshal(enc, m.Data, v)
}

// NewMsg builds a message on subject carrying v in encoding enc, with the
// Content-Type header set. It validates v first: a bad message is a bug on
// the sending side and is caught there.
func NewMsg(subject string, enc Encoding, v Message) (*nats.Msg, error) {
	if err := v.Validate(); err != nil {
		return nil, fmt.Errorf("send %s on %s: %w", typeName(v), subject, err)
	}
	data, err := Marshal(enc, v)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(subject)
	m.Header.Set(HeaderContentType, enc.ContentType())
	m.Data = data
	return m, nil
}

// Publish sends v (msgpack) on subject.
func Publish(nc *nats.Conn, subject string, v Message) error {
	return PublishAs(nc, subject, MsgPack, v)
}

// PublishAs sends v on subject in encoding enc: a job's events and tokens
// go to its client in the encoding of its submission.
func PublishAs(nc *nats.Conn, subject string, enc Encoding, v Message) error {
	m, err := NewMsg(subject, enc, v)
	if err != nil {
		return err
	}
	if err := nc.PublishMsg(m); err != nil {
		return fmt.Errorf("publish %s on %s: %w", typeName(v), subject, err)
	}
	return nil
}

// Respond answers request req with v in encoding enc (the request's, from
// DecodeMsg).
func Respond(req *nats.Msg, enc Encoding, v Message) error {
	if req.Reply == "" {
		return fmt.Errorf("answer %s on %s: the request has no reply subject", typeName(v), req.Subject)
	}
	m, err := NewMsg(req.Reply, enc, v)
	if err != nil {
		return err
	}
	if err := req.RespondMsg(m); err != nil {
		return fmt.Errorf("answer %s on %s: %w", typeName(v), req.Subject, err)
	}
	return nil
}

// Request sends req (msgpack) to subject and decodes the reply into rep. It
// waits until ctx is done, or DefaultRequestTimeout when ctx has no deadline.
// An error reply is not an error here: check rep's Err method.
func Request(ctx context.Context, nc *nats.Conn, subject string, req, rep Message) error {
	m, err := NewMsg(subject, MsgPack, req)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultRequestTimeout)
		defer cancel()
	}
	r, err := request(ctx, nc, m)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("%s request on %s: nobody serves this subject (is the coordinator or worker running?): %w", typeName(req), subject, err)
		}
		return fmt.Errorf("%s request on %s: %w", typeName(req), subject, err)
	}
	if _, err := DecodeMsg(r, rep); err != nil {
		return fmt.Errorf("%s reply on %s: %w", typeName(req), subject, err)
	}
	return nil
}

// request sends m and waits for its reply. A client request (ClientOf) is
// answered only on the asking client's own inbox (CheckClientReply): a
// connection whose inboxes lie elsewhere (nats.go's default "_INBOX", on a
// server without tandem identities) gets its reply on a one-off inbox under
// the client's prefix instead.
func request(ctx context.Context, nc *nats.Conn, m *nats.Msg) (*nats.Msg, error) {
	client, err := ClientOf(m.Subject)
	inbox := InboxPrefix(PrincipalClient, client) + "."
	if err != nil || strings.HasPrefix(nc.Opts.InboxPrefix+".", inbox) {
		return nc.RequestMsgWithContext(ctx, m)
	}
	m.Reply = inbox + strings.TrimPrefix(nats.NewInbox(), "_INBOX.")
	sub, err := nc.SubscribeSync(m.Reply)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(m); err != nil {
		return nil, err
	}
	return sub.NextMsgWithContext(ctx)
}

// Submit submits a job as the connection's client (ClientName) and returns
// the reply; a refusal is returned as a *RemoteError along with the reply.
func Submit(ctx context.Context, nc *nats.Conn, req *SubmitRequest) (*SubmitReply, error) {
	var rep SubmitReply
	if err := Request(ctx, nc, ClientSubmit(ClientName(nc)), req, &rep); err != nil {
		return nil, err
	}
	return &rep, rep.Err()
}

// Cancel asks the coordinator to cancel job id, a job of the connection's
// client.
func Cancel(ctx context.Context, nc *nats.Conn, jobID, reason string) (*CancelReply, error) {
	var rep CancelReply
	if err := Request(ctx, nc, ClientCancel(ClientName(nc)), &CancelRequest{JobID: jobID, Reason: reason}, &rep); err != nil {
		return nil, err
	}
	return &rep, rep.Err()
}

// ListJobs lists the jobs of the connection's client.
func ListJobs(ctx context.Context, nc *nats.Conn, req *ListJobsRequest) (*ListJobsReply, error) {
	var rep ListJobsReply
	if err := Request(ctx, nc, ClientList(ClientName(nc)), req, &rep); err != nil {
		return nil, err
	}
	return &rep, rep.Err()
}
