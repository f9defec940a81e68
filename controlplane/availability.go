package controlplane

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
)

// AvailabilityRequest asks the coordinators what the deployment can run
// now (on ClientAvailability): a client identity may not read the worker
// registry, so a front door without a coordinator in its process asks
// this before it queues a job nobody could take.
type AvailabilityRequest struct{}

// Validate accepts every request: it has no fields.
func (r *AvailabilityRequest) Validate() error { return nil }

// AvailabilityReply is the answering coordinator's view of its model's
// workers, from the registry it follows.
type AvailabilityReply struct {
	// Model is the model id the coordinator serves.
	Model string `msgpack:"model" json:"model"`
	// DecodeGroups counts the decode groups that can take jobs (every rank
	// registered and ready, the layers tiled), DecodeRanks their ranks.
	DecodeGroups int `msgpack:"decode_groups" json:"decode_groups"`
	DecodeRanks  int `msgpack:"decode_ranks" json:"decode_ranks"`
	// PrefillWorkers counts the prefill workers taking jobs.
	PrefillWorkers int `msgpack:"prefill_workers" json:"prefill_workers"`
	// MaxTokens is the longest sequence (prompt and output) a usable group
	// can hold when idle; 0 when there is none.
	MaxTokens int `msgpack:"max_tokens" json:"max_tokens"`
	// Problems say why registered decode groups cannot take jobs.
	Problems []string  `msgpack:"problems,omitempty" json:"problems,omitempty"`
	Error    string    `msgpack:"error,omitempty" json:"error,omitempty"`
	Code     ErrorCode `msgpack:"code,omitempty" json:"code,omitempty"`
}

// maxProblems bounds the problems a reply carries.
const maxProblems = 64

// Validate checks the counts.
func (r *AvailabilityReply) Validate() error {
	const msg = "AvailabilityReply"
	if err := checkReply(msg, r.Error, r.Code); err != nil {
		return err
	}
	if r.Error != "" {
		return nil
	}
	if err := CheckID(r.Model); err != nil {
		return fieldErr(msg, "model", "%v", err)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"decode_groups", r.DecodeGroups}, {"decode_ranks", r.DecodeRanks}, {"prefill_workers", r.PrefillWorkers}, {"max_tokens", r.MaxTokens}} {
		if f.v < 0 {
			return fieldErr(msg, f.name, "is %d, must be >= 0", f.v)
		}
	}
	if r.DecodeRanks < r.DecodeGroups {
		return fieldErr(msg, "decode_ranks", "is %d, fewer than the %d groups", r.DecodeRanks, r.DecodeGroups)
	}
	if len(r.Problems) > maxProblems {
		return fieldErr(msg, "problems", "has %d entries, at most %d", len(r.Problems), maxProblems)
	}
	return nil
}

// SetError turns r into an error reply.
func (r *AvailabilityReply) SetError(code ErrorCode, text string) {
	*r = AvailabilityReply{Error: text, Code: code}
}

// Err returns the reply's error as a *RemoteError, or nil.
func (r *AvailabilityReply) Err() error { return replyErr(r.Error, r.Code) }

// Available says whether a job could be placed now, and why not.
func (r *AvailabilityReply) Available() (ok bool, why string) {
	if r.DecodeGroups > 0 {
		return true, ""
	}
	why = fmt.Sprintf("no decode group of model %s is up", r.Model)
	if len(r.Problems) > 0 {
		why += fmt.Sprintf(" (%v)", r.Problems)
	}
	return false, why
}

// Availability asks the coordinators, as the connection's client, what
// the deployment can run now.
func Availability(ctx context.Context, nc *nats.Conn) (*AvailabilityReply, error) {
	var rep AvailabilityReply
	if err := Request(ctx, nc, ClientAvailability(ClientName(nc)), &AvailabilityRequest{}, &rep); err != nil {
		return nil, err
	}
	return &rep, rep.Err()
}
