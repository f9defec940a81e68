package controlplane

import (
	"context"

	"github.com/nats-io/nats.go"
)

// WorkerDrain is the request subject on which worker id takes a
// DrainRequest and answers a DrainReply: the worker stops taking jobs at
// once (its heartbeat says draining, so routers pass it by), lets the jobs
// it runs finish within its drain grace, and exits. Only the coordinator
// identity may publish it.
func WorkerDrain(workerID string) string { return Prefix + ".workers." + workerID + ".drain" }

// DrainRequest asks a worker to drain and exit.
type DrainRequest struct {
	WorkerID string `msgpack:"worker_id" json:"worker_id"`
	Reason   string `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// Validate checks the worker id and the reason.
func (r *DrainRequest) Validate() error {
	if err := CheckID(r.WorkerID); err != nil {
		return fieldErr("DrainRequest", "worker_id", "%v", err)
	}
	return checkText("DrainRequest", "reason", r.Reason, 4096)
}

// DrainReply answers a DrainRequest once the worker has stopped taking
// jobs: Running jobs are still finishing.
type DrainReply struct {
	WorkerID string    `msgpack:"worker_id,omitempty" json:"worker_id,omitempty"`
	Running  int       `msgpack:"running" json:"running"`
	Error    string    `msgpack:"error,omitempty" json:"error,omitempty"`
	Code     ErrorCode `msgpack:"code,omitempty" json:"code,omitempty"`
}

// Validate checks the reply.
func (r *DrainReply) Validate() error {
	const msg = "DrainReply"
	if err := checkReply(msg, r.Error, r.Code); err != nil {
		return err
	}
	if r.Error != "" {
		return nil
	}
	if err := CheckID(r.WorkerID); err != nil {
		return fieldErr(msg, "worker_id", "%v", err)
	}
	if r.Running < 0 {
		return fieldErr(msg, "running", "is %d, must be >= 0", r.Running)
	}
	return nil
}

// SetError turns r into an error reply.
func (r *DrainReply) SetError(code ErrorCode, text string) {
	*r = DrainReply{WorkerID: r.WorkerID, Error: text, Code: code}
}

// Err returns the reply's error as a *RemoteError, or nil.
func (r *DrainReply) Err() error { return replyErr(r.Error, r.Code) }

// Drain asks worker to drain and exit (reason is logged by the worker).
func Drain(ctx context.Context, nc *nats.Conn, worker, reason string) (*DrainReply, error) {
	var rep DrainReply
	if err := Request(ctx, nc, WorkerDrain(worker), &DrainRequest{WorkerID: worker, Reason: reason}, &rep); err != nil {
		return nil, err
	}
	return &rep, rep.Err()
}
