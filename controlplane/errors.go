package controlplane

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every decoding and validation error, so a server
// can tell a bad request (answer CodeBadRequest) from its own failure.
var ErrInvalid = errors.New("invalid message")

// FieldError says which field of which message is wrong and why.
type FieldError struct {
	Message string // message type, e.g. "SubmitRequest"
	Field   string // wire (snake_case) name, with an index or key when inside a list: "stop[2]"
	Problem string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Message + ": " + e.Problem
	}
	return e.Message + "." + e.Field + ": " + e.Problem
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(msg, field, format string, args ...any) error {
	return &FieldError{Message: msg, Field: field, Problem: fmt.Sprintf(format, args...)}
}

// ErrorCode classifies an error reply, so a client can act on it without
// parsing the text.
type ErrorCode string

const (
	CodeBadRequest  ErrorCode = "bad_request" // the request is malformed or invalid; do not retry it as is
	CodeTooLarge    ErrorCode = "too_large"   // the prompt or output exceeds a configured limit (the limit is in the text)
	CodeNotFound    ErrorCode = "not_found"   // no such job or worker
	CodeUnavailable ErrorCode = "unavailable" // no worker can take it now; retrying later may work
	CodeConflict    ErrorCode = "conflict"    // the request contradicts the current state (e.g. cancelling a finished job)
	CodeInternal    ErrorCode = "internal"    // the server failed; the text says where
)

func (c ErrorCode) valid() bool {
	switch c {
	case "", CodeBadRequest, CodeTooLarge, CodeNotFound, CodeUnavailable, CodeConflict, CodeInternal:
		return true
	}
	return false
}

// RemoteError is an error reply received from the other side of a request.
type RemoteError struct {
	Code    ErrorCode
	Message string
}

func (e *RemoteError) Error() string {
	if e.Code == "" {
		return e.Message
	}
	return string(e.Code) + ": " + e.Message
}
