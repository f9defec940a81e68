package controlplane

import (
	"fmt"
	"math"
	"time"
)

// JobState is a step of a job's lifecycle:
// queued -> routed -> prefilling -> transferring -> decoding -> done,
// or failed / cancelled from any step. A job routed locally skips
// transferring (the decode group prefills it itself).
type JobState string

const (
	StateQueued       JobState = "queued"
	StateRouted       JobState = "routed"
	StatePrefilling   JobState = "prefilling"
	StateTransferring JobState = "transferring"
	StateDecoding     JobState = "decoding"
	StateDone         JobState = "done"
	StateFailed       JobState = "failed"
	StateCancelled    JobState = "cancelled"
)

// Valid reports whether s is one of the lifecycle states.
func (s JobState) Valid() bool {
	switch s {
	case StateQueued, StateRouted, StatePrefilling, StateTransferring, StateDecoding,
		StateDone, StateFailed, StateCancelled:
		return true
	}
	return false
}

// Final reports whether s ends the job (done, failed or cancelled).
func (s JobState) Final() bool { return s == StateDone || s == StateFailed || s == StateCancelled }

// Target is where a job's prompt is prefilled.
type Target string

const (
	TargetLocal  Target = "local"  // by the decode group itself
	TargetRemote Target = "remote" // by a prefill worker, state transferred to the decode group
)

// RouteDecision records how the coordinator routed a job and why, with both
// predicted times to first token.
type RouteDecision struct {
	Policy          Policy        `msgpack:"policy" json:"policy"`
	Target          Target        `msgpack:"target" json:"target"`
	PredictedLocal  time.Duration `msgpack:"predicted_local_ns" json:"predicted_local_ns"`
	PredictedRemote time.Duration `msgpack:"predicted_remote_ns" json:"predicted_remote_ns"`
	PrefillWorker   string        `msgpack:"prefill_worker,omitempty" json:"prefill_worker,omitempty"`
	DecodeGroup     string        `msgpack:"decode_group" json:"decode_group"`
	Reason          string        `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// CachedTokens is the prefix of the prompt the decode group advertised
	// in its prefix cache, which the local prediction priced as not to be
	// prefilled.
	CachedTokens int `msgpack:"cached_tokens,omitempty" json:"cached_tokens,omitempty"`
	// Parts is the chosen path's prediction in parts (absent where it was
	// not measured): what a measured Timing is set against, part by part,
	// to see where the cost model is wrong.
	Parts *PredictedParts `msgpack:"parts,omitempty" json:"parts,omitempty"`
}

// PredictedParts are the parts of a predicted time to first token: the
// wait in front of the job (the running weight pass, or the decode group's
// queue), the weight pass that carries it (remote) or the group's own
// prefill (local), the state still in flight after the pass (remote), the
// first decode step, and the control plane's own latency on the path.
type PredictedParts struct {
	QueueWait    time.Duration `msgpack:"queue_wait_ns,omitempty" json:"queue_wait_ns,omitempty"`
	Pass         time.Duration `msgpack:"pass_ns,omitempty" json:"pass_ns,omitempty"`
	Prefill      time.Duration `msgpack:"prefill_ns,omitempty" json:"prefill_ns,omitempty"`
	TransferTail time.Duration `msgpack:"transfer_tail_ns,omitempty" json:"transfer_tail_ns,omitempty"`
	FirstStep    time.Duration `msgpack:"first_step_ns,omitempty" json:"first_step_ns,omitempty"`
	Overhead     time.Duration `msgpack:"overhead_ns,omitempty" json:"overhead_ns,omitempty"`
}

func (d *RouteDecision) validate(msg string) error {
	switch {
	case !d.Policy.valid():
		return fieldErr(msg, "route.policy", "is %q, must be auto, local or remote", d.Policy)
	case d.Target != TargetLocal && d.Target != TargetRemote:
		return fieldErr(msg, "route.target", "is %q, must be local or remote", d.Target)
	case d.PredictedLocal < 0 || d.PredictedRemote < 0:
		return fieldErr(msg, "route", "has a negative prediction (local %v, remote %v)", d.PredictedLocal, d.PredictedRemote)
	case d.CachedTokens < 0:
		return fieldErr(msg, "route.cached_tokens", "is %d, must be >= 0", d.CachedTokens)
	case d.Target == TargetRemote && d.PrefillWorker == "":
		return fieldErr(msg, "route.prefill_worker", "is empty for a remote route")
	case d.Parts != nil && min(d.Parts.QueueWait, d.Parts.Pass, d.Parts.Prefill, d.Parts.TransferTail, d.Parts.FirstStep, d.Parts.Overhead) < 0:
		return fieldErr(msg, "route.parts", "has a negative part (%+v)", *d.Parts)
	}
	if err := checkOptionalID(msg, "route.prefill_worker", d.PrefillWorker); err != nil {
		return err
	}
	if err := CheckID(d.DecodeGroup); err != nil {
		return fieldErr(msg, "route.decode_group", "%v", err)
	}
	return nil
}

// LayerProgress says how far prefill (or transfer) has got.
type LayerProgress struct {
	Done  int `msgpack:"done" json:"done"`   // layers finished
	Total int `msgpack:"total" json:"total"` // layers in the model
}

func (p *LayerProgress) validate(msg, field string) error {
	if p.Total <= 0 || p.Done < 0 || p.Done > p.Total {
		return fieldErr(msg, field, "is %d of %d layers, want 0 <= done <= total and total > 0", p.Done, p.Total)
	}
	return nil
}

// Timing is the final breakdown of where a job's time went. Durations are
// nanoseconds on the wire.
type Timing struct {
	Queue        time.Duration `msgpack:"queue_ns" json:"queue_ns"`                 // submitted -> routed
	PassWait     time.Duration `msgpack:"pass_wait_ns" json:"pass_wait_ns"`         // routed -> its weight pass started (remote)
	Prefill      time.Duration `msgpack:"prefill_ns" json:"prefill_ns"`             // prefill compute (either side)
	TransferTail time.Duration `msgpack:"transfer_tail_ns" json:"transfer_tail_ns"` // prefill end -> last layer's state committed
	FirstToken   time.Duration `msgpack:"first_token_ns" json:"first_token_ns"`     // submitted -> first token (TTFT)
	Decode       time.Duration `msgpack:"decode_ns" json:"decode_ns"`               // first token -> last token
	Total        time.Duration `msgpack:"total_ns" json:"total_ns"`                 // submitted -> final state
	PromptTokens int           `msgpack:"prompt_tokens" json:"prompt_tokens"`
	OutputTokens int           `msgpack:"output_tokens" json:"output_tokens"`
	// CachedTokens of the prompt came from a prefix cache instead of being
	// prefilled, on the worker CachedOn (the decode group's head).
	CachedTokens int    `msgpack:"cached_tokens,omitempty" json:"cached_tokens,omitempty"`
	CachedOn     string `msgpack:"cached_on,omitempty" json:"cached_on,omitempty"`
	// DecodeTokensPerSec is (output tokens - 1) / Decode.
	DecodeTokensPerSec float64 `msgpack:"decode_tok_s" json:"decode_tok_s"`
	// Speculation is the decode group's account of its speculative
	// decoding (nil: none reported).
	Speculation *Speculation `msgpack:"speculation,omitempty" json:"speculation,omitempty"`
}

func (t *Timing) validate(msg string) error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"queue_ns", t.Queue}, {"pass_wait_ns", t.PassWait}, {"prefill_ns", t.Prefill},
		{"transfer_tail_ns", t.TransferTail}, {"first_token_ns", t.FirstToken},
		{"decode_ns", t.Decode}, {"total_ns", t.Total}} {
		if d.v < 0 {
			return fieldErr(msg, "timing."+d.name, "is %d, must be >= 0", d.v)
		}
	}
	if t.PromptTokens < 0 || t.OutputTokens < 0 || t.CachedTokens < 0 {
		return fieldErr(msg, "timing", "has a negative token count (prompt %d, output %d, cached %d)", t.PromptTokens, t.OutputTokens, t.CachedTokens)
	}
	if t.CachedOn != "" {
		if err := CheckID(t.CachedOn); err != nil {
			return fieldErr(msg, "timing.cached_on", "%v", err)
		}
	}
	if err := checkRate(msg, "timing.decode_tok_s", t.DecodeTokensPerSec); err != nil {
		return err
	}
	if t.Speculation != nil {
		return t.Speculation.validate(msg, "timing.speculation")
	}
	return nil
}

// JobError says specifically why a job failed: which worker, which layer,
// what went wrong.
type JobError struct {
	Code    ErrorCode `msgpack:"code,omitempty" json:"code,omitempty"`
	Worker  string    `msgpack:"worker,omitempty" json:"worker,omitempty"`
	Layer   *int      `msgpack:"layer,omitempty" json:"layer,omitempty"` // nil: not tied to one layer
	Message string    `msgpack:"message" json:"message"`
}

func (e *JobError) Error() string {
	s := e.Message
	if e.Layer != nil {
		s = fmt.Sprintf("layer %d: %s", *e.Layer, s)
	}
	if e.Worker != "" {
		s = "worker " + e.Worker + ": " + s
	}
	return s
}

func (e *JobError) validate(msg, field string) error {
	switch {
	case e.Message == "":
		return fieldErr(msg, field+".message", "is empty: say why")
	case !e.Code.valid():
		return fieldErr(msg, field+".code", "is %q, not a known error code", e.Code)
	case e.Layer != nil && *e.Layer < 0:
		return fieldErr(msg, field+".layer", "is %d, must be >= 0", *e.Layer)
	}
	return checkOptionalID(msg, field+".worker", e.Worker)
}

// JobEvent is one step of a job's lifecycle, published by the coordinator
// on ClientJobEvents(client, job id). Seq numbers a job's events from 1, so a subscriber
// can order them and see a gap.
type JobEvent struct {
	JobID  string    `msgpack:"job_id" json:"job_id"`
	Seq    uint64    `msgpack:"seq" json:"seq"`
	State  JobState  `msgpack:"state" json:"state"`
	Time   time.Time `msgpack:"time" json:"time"`
	Detail string    `msgpack:"detail,omitempty" json:"detail,omitempty"`
	// Submitted is when the job was accepted; with Time it dates the event
	// within the job.
	Submitted time.Time      `msgpack:"submitted" json:"submitted"`
	Progress  *LayerProgress `msgpack:"progress,omitempty" json:"progress,omitempty"` // prefilling, transferring
	Route     *RouteDecision `msgpack:"route,omitempty" json:"route,omitempty"`       // routed and later
	Timing    *Timing        `msgpack:"timing,omitempty" json:"timing,omitempty"`     // final states
	Error     *JobError      `msgpack:"error,omitempty" json:"error,omitempty"`       // failed
	// Output: on a final event, everything the job generated, when its
	// decode group reported it.
	Output *Output `msgpack:"output,omitempty" json:"output,omitempty"`
}

// Validate checks the event's fields and that a failed event says why.
func (e *JobEvent) Validate() error {
	const msg = "JobEvent"
	if err := CheckID(e.JobID); err != nil {
		return fieldErr(msg, "job_id", "%v", err)
	}
	if !e.State.Valid() {
		return fieldErr(msg, "state", "is %q, not a lifecycle state", e.State)
	}
	if e.Seq == 0 {
		return fieldErr(msg, "seq", "is 0, events are numbered from 1")
	}
	if e.Time.IsZero() {
		return fieldErr(msg, "time", "is missing")
	}
	if e.Progress != nil {
		if err := e.Progress.validate(msg, "progress"); err != nil {
			return err
		}
	}
	if e.Route != nil {
		if err := e.Route.validate(msg); err != nil {
			return err
		}
	}
	if e.Timing != nil {
		if err := e.Timing.validate(msg); err != nil {
			return err
		}
	}
	if e.State == StateFailed && e.Error == nil {
		return fieldErr(msg, "error", "is missing from a failed event")
	}
	if e.Output != nil {
		if !e.State.Final() {
			return fieldErr(msg, "output", "is set on a %s event: only a final event carries the output", e.State)
		}
		if err := e.Output.validate(msg, "output"); err != nil {
			return err
		}
	}
	if e.Error != nil {
		if err := e.Error.validate(msg, "error"); err != nil {
			return err
		}
	}
	return nil
}

// FinishReason says why generation stopped.
type FinishReason string

const (
	FinishStop      FinishReason = "stop"      // a stop token or text, or end of sequence
	FinishLength    FinishReason = "length"    // max_tokens reached
	FinishCancelled FinishReason = "cancelled" // the job was cancelled
	FinishError     FinishReason = "error"     // the job failed; its events say why
)

// TokenMsg is one generated token, published by the decode group's rank 0
// on ClientJobTokens(client, job id). Index counts a job's tokens from 0; the last message
// has Final set and a FinishReason (and may carry no token: TokenID -1).
type TokenMsg struct {
	JobID   string `msgpack:"job_id" json:"job_id"`
	Index   int    `msgpack:"index" json:"index"`
	TokenID int32  `msgpack:"token_id" json:"token_id"`
	Text    string `msgpack:"text,omitempty" json:"text,omitempty"` // detokenized piece (may be empty mid-character); of a chat: the response channel's
	// Reasoning and Call, on a chat job (Sampling.Reply): the piece of
	// the think channel, and the piece of a tool call, that the token
	// completes.
	Reasoning    string       `msgpack:"reasoning,omitempty" json:"reasoning,omitempty"`
	Call         *CallDelta   `msgpack:"call,omitempty" json:"call,omitempty"`
	Final        bool         `msgpack:"final,omitempty" json:"final,omitempty"`
	FinishReason FinishReason `msgpack:"finish_reason,omitempty" json:"finish_reason,omitempty"`
}

// Validate checks the token message.
func (m *TokenMsg) Validate() error {
	const msg = "TokenMsg"
	if err := CheckID(m.JobID); err != nil {
		return fieldErr(msg, "job_id", "%v", err)
	}
	switch {
	case m.Index < 0:
		return fieldErr(msg, "index", "is %d, must be >= 0", m.Index)
	case m.TokenID < -1:
		return fieldErr(msg, "token_id", "is %d, must be a token id or -1 (none)", m.TokenID)
	case m.TokenID == -1 && !m.Final:
		return fieldErr(msg, "token_id", "is -1 (none) on a message that is not final")
	case m.Final != (m.FinishReason != ""):
		return fieldErr(msg, "finish_reason", "is %q with final %v: the final message, and only it, says why", m.FinishReason, m.Final)
	}
	switch m.FinishReason {
	case "", FinishStop, FinishLength, FinishCancelled, FinishError:
	default:
		return fieldErr(msg, "finish_reason", "is %q, must be stop, length, cancelled or error", m.FinishReason)
	}
	if c := m.Call; c != nil && (c.Index < 0 || c.Index >= MaxToolCalls) {
		return fieldErr(msg, "call.index", "is %d, must be in [0, %d)", c.Index, MaxToolCalls)
	}
	return nil
}

// CallDelta is a piece of a chat reply's tool call: Index counts the
// reply's calls from 0; Name is set on the piece that starts the call;
// Arguments continue the call's arguments, one JSON object.
type CallDelta struct {
	Index     int    `msgpack:"index" json:"index"`
	Name      string `msgpack:"name,omitempty" json:"name,omitempty"`
	Arguments string `msgpack:"arguments,omitempty" json:"arguments,omitempty"`
}

// CancelRequest asks to cancel a job: sent by a client to the coordinator on
// ClientCancel(client), and by the coordinator to each worker involved on
// WorkerCancel(worker id).
type CancelRequest struct {
	JobID  string `msgpack:"job_id" json:"job_id"`
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// Validate checks the job id.
func (r *CancelRequest) Validate() error {
	if err := CheckID(r.JobID); err != nil {
		return fieldErr("CancelRequest", "job_id", "%v", err)
	}
	return checkText("CancelRequest", "reason", r.Reason, 4096)
}

// CancelReply answers a CancelRequest with the job's state afterwards (or an
// error); a worker also says how much memory it freed.
type CancelReply struct {
	JobID      string    `msgpack:"job_id,omitempty" json:"job_id,omitempty"`
	State      JobState  `msgpack:"state,omitempty" json:"state,omitempty"`
	FreedBytes uint64    `msgpack:"freed_bytes,omitempty" json:"freed_bytes,omitempty"`
	Error      string    `msgpack:"error,omitempty" json:"error,omitempty"`
	Code       ErrorCode `msgpack:"code,omitempty" json:"code,omitempty"`
}

// Validate checks the reply.
func (r *CancelReply) Validate() error {
	const msg = "CancelReply"
	if err := checkReply(msg, r.Error, r.Code); err != nil {
		return err
	}
	if r.Error != "" {
		return nil
	}
	if err := CheckID(r.JobID); err != nil {
		return fieldErr(msg, "job_id", "%v", err)
	}
	if !r.State.Valid() {
		return fieldErr(msg, "state", "is %q, not a lifecycle state", r.State)
	}
	return nil
}

// Err returns the reply's error as a *RemoteError, or nil.
func (r *CancelReply) Err() error { return replyErr(r.Error, r.Code) }

// ListJobsRequest asks the coordinator for its jobs, newest first.
type ListJobsRequest struct {
	// JobID asks for that job only: its latest event, or its final one
	// from the results store (a client resuming after a lost connection).
	JobID string   `msgpack:"job_id,omitempty" json:"job_id,omitempty"`
	State JobState `msgpack:"state,omitempty" json:"state,omitempty"` // only jobs in this state
	Limit int      `msgpack:"limit,omitempty" json:"limit,omitempty"` // 0: the coordinator's default
}

// Validate checks the filter.
func (r *ListJobsRequest) Validate() error {
	if r.State != "" && !r.State.Valid() {
		return fieldErr("ListJobsRequest", "state", "is %q, not a lifecycle state", r.State)
	}
	if r.Limit < 0 {
		return fieldErr("ListJobsRequest", "limit", "is %d, must be >= 0", r.Limit)
	}
	return checkOptionalID("ListJobsRequest", "job_id", r.JobID)
}

// ListJobsReply carries each job's latest event.
type ListJobsReply struct {
	Jobs  []JobEvent `msgpack:"jobs" json:"jobs"`
	Error string     `msgpack:"error,omitempty" json:"error,omitempty"`
	Code  ErrorCode  `msgpack:"code,omitempty" json:"code,omitempty"`
}

// Validate checks every job in the reply.
func (r *ListJobsReply) Validate() error {
	if err := checkReply("ListJobsReply", r.Error, r.Code); err != nil {
		return err
	}
	for i := range r.Jobs {
		if err := r.Jobs[i].Validate(); err != nil {
			return fmt.Errorf("ListJobsReply.jobs[%d]: %w", i, err)
		}
	}
	return nil
}

// Err returns the reply's error as a *RemoteError, or nil.
func (r *ListJobsReply) Err() error { return replyErr(r.Error, r.Code) }

func checkOptionalID(msg, field, id string) error {
	if id == "" {
		return nil
	}
	if err := CheckID(id); err != nil {
		return fieldErr(msg, field, "%v", err)
	}
	return nil
}

func checkRate(msg, field string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fieldErr(msg, field, "is %v, must be a finite number >= 0", v)
	}
	return nil
}
