package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Output is what a job generated, in full: the decode group's rank 0 puts
// it in its final Progress and the coordinator in the job's final event,
// so that a client that missed token messages (its connection dropped)
// still gets every token and the whole text.
type Output struct {
	TokenIDs     []int32      `msgpack:"token_ids" json:"token_ids"`
	Text         string       `msgpack:"text,omitempty" json:"text,omitempty"` // the concatenation of the token messages' texts
	FinishReason FinishReason `msgpack:"finish_reason,omitempty" json:"finish_reason,omitempty"`
	// Reasoning and ToolCalls, of a chat job: the think channel and the
	// calls, whole. Malformed: the reply held structure the decode group
	// could not read (kept in Text).
	Reasoning string     `msgpack:"reasoning,omitempty" json:"reasoning,omitempty"`
	ToolCalls []ToolCall `msgpack:"tool_calls,omitempty" json:"tool_calls,omitempty"`
	Malformed bool       `msgpack:"malformed,omitempty" json:"malformed,omitempty"`
}

func (o *Output) validate(msg, field string) error {
	for i, id := range o.TokenIDs {
		if id < 0 {
			return fieldErr(msg, fmt.Sprintf("%s.token_ids[%d]", field, i), "is %d, must be >= 0", id)
		}
	}
	switch o.FinishReason {
	case "", FinishStop, FinishLength, FinishCancelled, FinishError:
	default:
		return fieldErr(msg, field+".finish_reason", "is %q, must be stop, length, cancelled or error", o.FinishReason)
	}
	if len(o.ToolCalls) > MaxToolCalls {
		return fieldErr(msg, field+".tool_calls", "has %d calls, at most %d allowed", len(o.ToolCalls), MaxToolCalls)
	}
	return nil
}

// JobStatusRequest asks a worker what it knows of a job (on
// WorkerStatus(worker id)). It changes nothing on the worker: a coordinator
// that takes over a job asks before it assigns anything.
type JobStatusRequest struct {
	JobID string `msgpack:"job_id" json:"job_id"`
}

// Validate checks the job id.
func (r *JobStatusRequest) Validate() error {
	if err := CheckID(r.JobID); err != nil {
		return fieldErr("JobStatusRequest", "job_id", "%v", err)
	}
	return nil
}

// JobStatusReply is a worker's account of a job: Held while the job runs
// there (Progress is then its latest report), or its final report when
// the job ended there recently (Progress.Stage final). Neither: the worker
// does not know the job.
type JobStatusReply struct {
	JobID    string    `msgpack:"job_id" json:"job_id"`
	WorkerID string    `msgpack:"worker_id" json:"worker_id"`
	Held     bool      `msgpack:"held,omitempty" json:"held,omitempty"`
	Progress *Progress `msgpack:"progress,omitempty" json:"progress,omitempty"`
	Error    string    `msgpack:"error,omitempty" json:"error,omitempty"`
	Code     ErrorCode `msgpack:"code,omitempty" json:"code,omitempty"`
}

// Validate checks the reply.
func (r *JobStatusReply) Validate() error {
	const msg = "JobStatusReply"
	if err := checkReply(msg, r.Error, r.Code); err != nil {
		return err
	}
	if r.Error != "" {
		// A refusal of a request that did not decode names no job.
		return nil
	}
	if err := CheckID(r.JobID); err != nil {
		return fieldErr(msg, "job_id", "%v", err)
	}
	if err := CheckID(r.WorkerID); err != nil {
		return fieldErr(msg, "worker_id", "%v", err)
	}
	if r.Held && r.Progress != nil && r.Progress.Stage.Final() {
		return fieldErr(msg, "held", "is true with a final report (%s)", r.Progress.Stage)
	}
	if r.Progress != nil {
		if err := r.Progress.Validate(); err != nil {
			return fmt.Errorf("%s.progress: %w", msg, err)
		}
		if r.Progress.JobID != r.JobID {
			return fieldErr(msg, "progress.job_id", "is %s, the reply is for %s", r.Progress.JobID, r.JobID)
		}
	}
	return nil
}

// SetError turns r into an error reply.
func (r *JobStatusReply) SetError(code ErrorCode, text string) {
	*r = JobStatusReply{JobID: r.JobID, WorkerID: r.WorkerID, Error: text, Code: code}
}

// StatusOf is worker's account of job from its latest report p (nil: the
// job is unknown there). running says the worker still holds the job's
// runner; a runner whose report is already final is only putting the job
// away, so the job is ended, not held.
func StatusOf(job, worker string, p *Progress, running bool) *JobStatusReply {
	return &JobStatusReply{JobID: job, WorkerID: worker, Progress: p,
		Held: running && (p == nil || !p.Stage.Final())}
}

// Err returns the reply's error as a *RemoteError, or nil.
func (r *JobStatusReply) Err() error { return replyErr(r.Error, r.Code) }

// Finished reports whether the worker ended the job recently, and how.
func (r *JobStatusReply) Finished() bool {
	return !r.Held && r.Progress != nil && r.Progress.Stage.Final()
}

// JobStatus asks worker what it knows of job.
func JobStatus(ctx context.Context, nc *nats.Conn, worker, job string) (*JobStatusReply, error) {
	var rep JobStatusReply
	if err := Request(ctx, nc, WorkerStatus(worker), &JobStatusRequest{JobID: job}, &rep); err != nil {
		return nil, err
	}
	return &rep, rep.Err()
}

// ResultsConfig configures the store of final job events. Zero fields take
// the defaults.
type ResultsConfig struct {
	Bucket string // default ResultsBucket
	// TTL is how long a job's final event is kept; default 1 h.
	TTL      time.Duration
	Memory   bool
	Replicas int // default 1
}

// Results keeps each finished job's final event (with its output) for a
// while, in a JetStream key-value bucket shared by every coordinator: a
// client whose connection dropped while its job ended asks any
// coordinator and gets the event from here.
type Results struct {
	nc *nats.Conn
	kv jetstream.KeyValue
}

// OpenResults creates the bucket, or updates it to cfg when it exists.
func OpenResults(ctx context.Context, nc *nats.Conn, cfg ResultsConfig) (*Results, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = ResultsBucket
	}
	if cfg.TTL <= 0 {
		cfg.TTL = time.Hour
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	kv, err := openBucket(ctx, nc, cfg.Memory, jetstream.KeyValueConfig{
		Bucket:       cfg.Bucket,
		Description:  "tandem finished jobs: key = <client>.<job id>, value = the final JobEvent (msgpack)",
		History:      1,
		TTL:          cfg.TTL,
		Replicas:     cfg.Replicas,
		MaxValueSize: MaxMessageSize,
	})
	if err != nil {
		return nil, fmt.Errorf("job results: bucket %s: %w", cfg.Bucket, err)
	}
	return &Results{nc: nc, kv: kv}, nil
}

// resultKey is where client's job id is kept: under the client's name, so
// that a lookup finds only the asking client's own jobs.
func resultKey(client, id string) string { return client + "." + id }

// Put stores the final event of a job of client.
func (r *Results) Put(ctx context.Context, client string, ev *JobEvent) error {
	if err := CheckID(client); err != nil {
		return fmt.Errorf("job results: put: client: %w", err)
	}
	if !ev.State.Final() {
		return fmt.Errorf("job results: put %s: state %s is not final", ev.JobID, ev.State)
	}
	if err := ev.Validate(); err != nil {
		return fmt.Errorf("job results: put: %w", err)
	}
	data, err := Marshal(MsgPack, ev)
	if err != nil {
		return err
	}
	if _, err := r.kv.Put(ctx, resultKey(client, ev.JobID), data); err != nil {
		return fmt.Errorf("job results: put %s: %w", ev.JobID, err)
	}
	return nil
}

// Get returns the final event of client's job id; ok is false when none
// is stored.
func (r *Results) Get(ctx context.Context, client, id string) (ev *JobEvent, ok bool, err error) {
	if err := CheckID(id); err != nil {
		return nil, false, fmt.Errorf("job results: get: %w", err)
	}
	if err := CheckID(client); err != nil {
		return nil, false, fmt.Errorf("job results: get: client: %w", err)
	}
	e, err := r.kv.Get(ctx, resultKey(client, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("job results: get %s: %w", id, err)
	}
	var out JobEvent
	if err := Unmarshal(MsgPack, e.Value(), &out); err != nil {
		return nil, false, fmt.Errorf("job results: %s: %w", id, err)
	}
	return &out, true, nil
}

// List calls visit with the final event of each job of client that the
// store still holds (at most results' TTL old), in the order they were
// stored. A value that does not decode is skipped and counted in bad.
func (r *Results) List(ctx context.Context, client string, visit func(*JobEvent)) (bad int, err error) {
	if err := CheckID(client); err != nil {
		return 0, fmt.Errorf("job results: list: client: %w", err)
	}
	w, err := r.kv.Watch(ctx, resultKey(client, "*"), jetstream.IgnoreDeletes())
	if err != nil {
		return 0, fmt.Errorf("job results: list: %w", err)
	}
	defer stopWatch(r.nc, w)
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return bad, fmt.Errorf("job results: list: the watch ended early")
			}
			if e == nil {
				return bad, nil // every stored value has been delivered
			}
			var ev JobEvent
			if Unmarshal(MsgPack, e.Value(), &ev) != nil || ev.Validate() != nil {
				bad++
				continue
			}
			visit(&ev)
		case <-ctx.Done():
			return bad, fmt.Errorf("job results: list: %w", ctx.Err())
		}
	}
}
