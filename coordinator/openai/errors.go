package openai

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// apiError is an error answered in OpenAI's shape,
// {"error": {"message", "type", "param", "code"}}, with its HTTP status.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

type errorBody struct {
	Error *apiError `json:"error"`
}

func newErr(status int, typ, code, param, format string, args ...any) *apiError {
	e := &apiError{Status: status, Type: typ, Message: fmt.Sprintf(format, args...)}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	return e
}

// badRequest is a 400 about one parameter.
func badRequest(param, format string, args ...any) *apiError {
	return newErr(http.StatusBadRequest, "invalid_request_error", "invalid_value", param, format, args...)
}

// tooLong is a 413: the prompt (or prompt and output) exceeds a limit.
func tooLong(param, format string, args ...any) *apiError {
	return newErr(http.StatusRequestEntityTooLarge, "invalid_request_error", "context_length_exceeded", param, format, args...)
}

// noWorkers is a 503: no decode group can take a job of the model now,
// why as the coordinators say.
func noWorkers(why string) *apiError {
	return newErr(http.StatusServiceUnavailable, "service_unavailable", "no_workers", "", "%s; retry later", why)
}

// fromJob maps a refusal or a failure of the job (a *cp.RemoteError from
// the submission, a *cp.JobError from its final event) to a status.
func fromJob(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return newErr(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "messages", "%v", err)
	}
	code := cp.ErrorCode("")
	var re *cp.RemoteError
	var je *cp.JobError
	switch {
	case errors.As(err, &re):
		code = re.Code
	case errors.As(err, &je):
		code = je.Code
	}
	switch code {
	case cp.CodeBadRequest:
		return newErr(http.StatusBadRequest, "invalid_request_error", "invalid_value", "", "%v", err)
	case cp.CodeTooLarge:
		return tooLong("messages", "%v", err)
	case cp.CodeNotFound:
		return newErr(http.StatusNotFound, "invalid_request_error", "not_found", "", "%v", err)
	case cp.CodeUnavailable:
		return newErr(http.StatusServiceUnavailable, "service_unavailable", "unavailable", "", "%v", err)
	}
	return newErr(http.StatusInternalServerError, "server_error", "internal_error", "", "%v", err)
}
