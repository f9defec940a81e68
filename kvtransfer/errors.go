package kvtransfer

import (
	"errors"
	"fmt"
)

// Errors a transfer can end with; test with errors.Is. A refusal sent by the
// far side carries its code over the wire, so that errors.Is works on the
// sender for a receiver's refusal too.
var (
	// ErrAuth: the peer could not prove the session secret (or proved it
	// against a nonce that was not this connection's).
	ErrAuth = errors.New("authentication failed")
	// ErrUnknownSession: the server expects no session of that id.
	ErrUnknownSession = errors.New("unknown session")
	// ErrProtocol: a frame broke the protocol (bad header, shape, dtype,
	// offset, length, sequence number, or totals).
	ErrProtocol = errors.New("protocol violation")
	// ErrDeadline: the session's deadline passed before the state committed.
	ErrDeadline = errors.New("transfer deadline passed")
	// ErrAborted: the sender gave up on the sequence.
	ErrAborted = errors.New("transfer aborted by sender")
	// ErrCanceled: the receiver canceled the session.
	ErrCanceled = errors.New("session canceled by receiver")
	// ErrClosed: the server or sender was closed.
	ErrClosed = errors.New("closed")
)

// Error is a failed transfer, naming what an operator needs to act: the job,
// the session, the first layer that did not complete (-1 when the failure is
// not about one layer) and the peer's address (empty when there was none).
type Error struct {
	Job     string
	Session string
	Layer   int
	Peer    string
	Err     error
}

func (e *Error) Error() string {
	s := "kvtransfer: job " + e.Job
	if e.Session != e.Job {
		s += " (session " + e.Session + ")"
	}
	if e.Layer >= 0 {
		s += fmt.Sprintf(" layer %d", e.Layer)
	}
	if e.Peer != "" {
		s += " peer " + e.Peer
	}
	return s + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Wire error codes (the ERROR frame's "code").
const (
	codeAuth     = "auth"
	codeUnknown  = "unknown_session"
	codeProtocol = "protocol"
	codeDeadline = "deadline"
	codeAborted  = "aborted"
	codeCanceled = "canceled"
	codeClosed   = "closed"
	codeFailed   = "failed"
)

func errorCode(err error) string {
	switch {
	case errors.Is(err, ErrAuth):
		return codeAuth
	case errors.Is(err, ErrUnknownSession):
		return codeUnknown
	case errors.Is(err, ErrProtocol):
		return codeProtocol
	case errors.Is(err, ErrDeadline):
		return codeDeadline
	case errors.Is(err, ErrAborted):
		return codeAborted
	case errors.Is(err, ErrCanceled):
		return codeCanceled
	case errors.Is(err, ErrClosed):
		return codeClosed
	}
	return codeFailed
}

// remoteError is a refusal received in an ERROR frame.
type remoteError struct {
	code, msg string
}

func (e *remoteError) Error() string { return "refused by peer: " + e.msg }

func (e *remoteError) Is(target error) bool {
	return errorCode(target) == e.code && e.code != codeFailed
}
