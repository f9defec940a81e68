// Package frontdoor is a decode group's client protocol: a small
// authenticated message channel (kvtransfer.Channel, on each rank's
// kvtransfer port) over which a client submits and cancels sequences on
// rank 0 and receives their tokens, and reads any rank's stats. The
// decode-worker binary serves it so that a group of processes can be driven
// and observed before (and besides) the NATS control plane, which calls the
// pipeline's Go API in process instead.
package frontdoor

import (
	"fmt"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
)

// ChannelID is the channel id a rank of group accepts clients on.
func ChannelID(group string) string { return group + "/client" }

// Operations.
const (
	opSubmit   = "submit"
	opCancel   = "cancel"
	opStats    = "stats"
	opAdmitted = "admitted"
	opRefused  = "refused"
	opToken    = "token"
	opEnd      = "end"
	opError    = "error"
)

// request is a client's message.
type request struct {
	Op     string      `msgpack:"op"`
	Seq    string      `msgpack:"seq,omitempty"`
	Submit *submitBody `msgpack:"submit,omitempty"`
}

type submitBody struct {
	Tokens      []int32     `msgpack:"tokens"`
	MaxTokens   int         `msgpack:"max_tokens"`
	Temperature float64     `msgpack:"temperature,omitempty"`
	TopK        int         `msgpack:"top_k,omitempty"`
	TopP        float64     `msgpack:"top_p,omitempty"`
	Seed        uint64      `msgpack:"seed,omitempty"`
	Stop        []int32     `msgpack:"stop,omitempty"`
	Remote      *remoteBody `msgpack:"remote,omitempty"`
}

type remoteBody struct {
	Tokens   int           `msgpack:"tokens"`
	Sessions []sessionBody `msgpack:"sessions"`
	Deadline int64         `msgpack:"deadline"` // unix ns
}

type sessionBody struct {
	ID     string `msgpack:"id"`
	Secret []byte `msgpack:"secret"`
}

// reply is the server's message.
type reply struct {
	Op     string          `msgpack:"op"`
	Seq    string          `msgpack:"seq,omitempty"`
	Index  int             `msgpack:"index,omitempty"`
	Token  int32           `msgpack:"token,omitempty"`
	Reason string          `msgpack:"reason,omitempty"`
	Err    string          `msgpack:"err,omitempty"`
	Rank   int             `msgpack:"rank,omitempty"` // the refusing rank
	Tokens int             `msgpack:"tokens,omitempty"`
	Stats  *pipeline.Stats `msgpack:"stats,omitempty"`
	// Goroutines is the serving process's goroutine count (stats).
	Goroutines int `msgpack:"goroutines,omitempty"`
}

// Request is a sequence to submit (pipeline.Request without the sink).
type Request struct {
	ID        string
	Tokens    []int32
	MaxTokens int
	// Sampling: zero Temperature is greedy.
	Temperature float64
	TopK        int
	TopP        float64
	Seed        uint64
	Stop        []int32
	Remote      *pipeline.Remote
}

// Result is how a sequence ended, as the client sees it.
type Result struct {
	Reason pipeline.Reason
	Err    string // set when Reason is error
	Tokens int
}

// Stats is a rank's snapshot and its process's goroutine count.
type Stats struct {
	pipeline.Stats
	Goroutines int
}

// RefusedError is a refused submission, as pipeline.RefusedError.
type RefusedError = pipeline.RefusedError

func (r *Request) body() *submitBody {
	b := &submitBody{Tokens: r.Tokens, MaxTokens: r.MaxTokens, Temperature: r.Temperature, TopK: r.TopK, TopP: r.TopP,
		Seed: r.Seed, Stop: r.Stop}
	if rm := r.Remote; rm != nil {
		b.Remote = &remoteBody{Tokens: rm.Tokens, Deadline: rm.Deadline.UnixNano()}
		for _, s := range rm.Sessions {
			b.Remote.Sessions = append(b.Remote.Sessions, sessionBody{ID: s.ID, Secret: s.Secret})
		}
	}
	return b
}

func errorf(format string, args ...any) error { return fmt.Errorf("frontdoor: "+format, args...) }
