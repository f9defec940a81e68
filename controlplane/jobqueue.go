package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// QueuedJob is what the job queue stores for one accepted submission.
type QueuedJob struct {
	JobID     string        `msgpack:"job_id" json:"job_id"`
	Submitted time.Time     `msgpack:"submitted" json:"submitted"`
	Request   SubmitRequest `msgpack:"request" json:"request"`
	// Client is the client that submitted the job (its namespace gets the
	// job's events and tokens; only it may cancel the job).
	Client string `msgpack:"client" json:"client"`
	// Encoding is the submission's encoding (Encoding.Field: "" msgpack,
	// "json"), in which the client gets the job's events and tokens.
	Encoding string `msgpack:"encoding,omitempty" json:"encoding,omitempty"`
}

// WireEncoding is the encoding the job's client gets its events and
// tokens in (msgpack unless Encoding says json).
func (j *QueuedJob) WireEncoding() Encoding {
	e, _ := EncodingNamed(j.Encoding)
	return e
}

// Validate checks the job and its request.
func (j *QueuedJob) Validate() error {
	if err := CheckID(j.JobID); err != nil {
		return fieldErr("QueuedJob", "job_id", "%v", err)
	}
	if j.Submitted.IsZero() {
		return fieldErr("QueuedJob", "submitted", "is missing")
	}
	if err := CheckID(j.Client); err != nil {
		return fieldErr("QueuedJob", "client", "%v", err)
	}
	if _, err := EncodingNamed(j.Encoding); err != nil {
		return fieldErr("QueuedJob", "encoding", "%v", err)
	}
	return j.Request.Validate()
}

// QueueConfig configures the job queue. Zero fields take the defaults.
type QueueConfig struct {
	Stream   string // default JobsStream
	Subject  string // default SubjectJobQueue
	Consumer string // durable consumer name; default JobsConsumer
	// DuplicateWindow is how long a job id (and so an idempotency key) is
	// remembered for deduplication; default 2 min.
	DuplicateWindow time.Duration
	// AckWait is how long a delivered job may go without an ack or an
	// in-progress signal before it is delivered again; default 30 s.
	AckWait time.Duration
	// MaxDeliver is how many times a job is delivered before the queue
	// gives up on it (a job that crashes every coordinator); default 5.
	MaxDeliver int
	// MaxJobs caps the jobs held (queued and running); a submission beyond
	// it is refused, not dropped. 0: no cap.
	MaxJobs int64
	// Memory keeps the queue in memory instead of on disk (tests).
	Memory   bool
	Replicas int // default 1
}

func (c *QueueConfig) withDefaults() QueueConfig {
	d := *c
	if d.Stream == "" {
		d.Stream = JobsStream
	}
	if d.Subject == "" {
		d.Subject = SubjectJobQueue
	}
	if d.Consumer == "" {
		d.Consumer = JobsConsumer
	}
	if d.DuplicateWindow <= 0 {
		d.DuplicateWindow = 2 * time.Minute
	}
	if d.AckWait <= 0 {
		d.AckWait = 30 * time.Second
	}
	if d.MaxDeliver == 0 {
		d.MaxDeliver = 5
	}
	if d.Replicas <= 0 {
		d.Replicas = 1
	}
	return d
}

// JobQueue is the durable queue of submitted jobs: a JetStream work-queue
// stream (a job stays stored until it is acknowledged) deduplicated by job
// id, with one durable pull consumer shared by all coordinators.
type JobQueue struct {
	js       jetstream.JetStream
	stream   jetstream.Stream
	consumer jetstream.Consumer
	cfg      QueueConfig
}

// OpenJobQueue creates the stream and the durable consumer, or updates them
// to cfg when they exist (the jobs in them are kept).
func OpenJobQueue(ctx context.Context, nc *nats.Conn, cfg QueueConfig) (*JobQueue, error) {
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("job queue: %w", err)
	}
	storage := jetstream.FileStorage
	if cfg.Memory {
		storage = jetstream.MemoryStorage
	}
	maxMsgs := cfg.MaxJobs
	if maxMsgs <= 0 {
		maxMsgs = -1
	}
	var stream jetstream.Stream
	sc := jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "tandem submitted jobs; a job is removed when it reaches a final state",
		Subjects:    []string{cfg.Subject},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     storage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
		MaxMsgs:     maxMsgs,
		Discard:     jetstream.DiscardNew,
		MaxMsgSize:  MaxMessageSize,
	}
	err = whileJetStreamSettles(ctx, func(ctx context.Context) (err error) {
		stream, err = js.CreateOrUpdateStream(ctx, sc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("job queue: stream %s on %s: %w", cfg.Stream, cfg.Subject, err)
	}
	var consumer jetstream.Consumer
	cc := jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		Description:   "tandem coordinators",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		FilterSubject: cfg.Subject,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: -1,
	}
	err = whileJetStreamSettles(ctx, func(ctx context.Context) (err error) {
		consumer, err = stream.CreateOrUpdateConsumer(ctx, cc)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("job queue: consumer %s on stream %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	return &JobQueue{js: js, stream: stream, consumer: consumer, cfg: cfg}, nil
}

// Config returns the queue's configuration, defaults filled in.
func (q *JobQueue) Config() QueueConfig { return q.cfg }

// Enqueued is the outcome of Enqueue.
type Enqueued struct {
	Seq uint64 // stream sequence of the stored job
	// Duplicate: a job with this id was already enqueued within the
	// duplicate window; nothing new was stored.
	Duplicate bool
}

// Enqueue stores job, deduplicated by job id within the duplicate window
// (so a retried submission with the same idempotency key runs once). It
// returns once the server has stored it.
func (q *JobQueue) Enqueue(ctx context.Context, job *QueuedJob) (Enqueued, error) {
	m, err := NewMsg(q.cfg.Subject, MsgPack, job)
	if err != nil {
		return Enqueued{}, err
	}
	ack, err := q.js.PublishMsg(ctx, m, jetstream.WithMsgID(job.JobID), jetstream.WithExpectStream(q.cfg.Stream))
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStreamStoreFailed {
			return Enqueued{}, &RemoteError{Code: CodeUnavailable, Message: fmt.Sprintf("job queue is full (max %d jobs): %v", q.cfg.MaxJobs, err)}
		}
		return Enqueued{}, fmt.Errorf("enqueue job %s: %w", job.JobID, err)
	}
	return Enqueued{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// QueueStats counts the queue's jobs.
type QueueStats struct {
	Waiting  uint64 // stored, not yet delivered to a coordinator
	InFlight int    // delivered, not yet acknowledged (running)
	Stored   uint64 // both, as the stream counts them
}

// Stats reads the queue's counters from the server.
func (q *JobQueue) Stats(ctx context.Context) (QueueStats, error) {
	ci, err := q.consumer.Info(ctx)
	if err != nil {
		return QueueStats{}, fmt.Errorf("job queue stats: %w", err)
	}
	si, err := q.stream.Info(ctx)
	if err != nil {
		return QueueStats{}, fmt.Errorf("job queue stats: %w", err)
	}
	return QueueStats{Waiting: ci.NumPending, InFlight: ci.NumAckPending, Stored: si.State.Msgs}, nil
}

// jsErrStreamStoreFailed is the JetStream error code for a message the
// stream refused to store (here: the MaxJobs cap with discard-new).
const jsErrStreamStoreFailed jetstream.ErrorCode = 10077

// pollWait bounds one pull request, so a lost request is retried soon.
const pollWait = 5 * time.Second

// Next waits for the next job, until ctx ends. A stored message that does
// not decode is terminated (never delivered again) and reported as an error
// wrapping ErrInvalid; call Next again after it.
func (q *JobQueue) Next(ctx context.Context) (*Delivery, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if expired(ctx) {
			return nil, context.DeadlineExceeded
		}
		pollCtx, cancel := context.WithTimeout(ctx, pollWait)
		msg, err := q.consumer.Next(jetstream.FetchContext(pollCtx))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if expired(ctx) {
				// The deadline passed before its timer fired: the
				// library refuses a pull that cannot be waited for.
				return nil, context.DeadlineExceeded
			}
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			return nil, fmt.Errorf("job queue: fetch: %w", err)
		}
		return q.delivery(msg)
	}
}

// expired reports whether ctx's deadline is (all but) reached.
func expired(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < time.Millisecond
}

func (q *JobQueue) delivery(msg jetstream.Msg) (*Delivery, error) {
	d := &Delivery{msg: msg, ackWait: q.cfg.AckWait, maxDeliver: q.cfg.MaxDeliver}
	if md, err := msg.Metadata(); err == nil {
		d.Seq, d.NumDelivered = md.Sequence.Stream, md.NumDelivered
	}
	var job QueuedJob
	enc, err := EncodingOf(&nats.Msg{Header: nats.Header(msg.Headers())})
	if err == nil {
		err = Unmarshal(enc, msg.Data(), &job)
	}
	if err != nil {
		reason := fmt.Sprintf("undecodable job message: %v", err)
		_ = msg.TermWithReason(reason)
		return nil, fmt.Errorf("job queue: message %d terminated: %w", d.Seq, err)
	}
	d.Job = &job
	return d, nil
}

// Delivery is one delivery of a queued job to a coordinator. It must end
// with exactly one of Ack (the job reached a final state), Release (hand it
// to another coordinator) or Reject (never run it); until then, KeepAlive or
// InProgress keep the queue from delivering it elsewhere.
type Delivery struct {
	Job          *QueuedJob
	Seq          uint64 // stream sequence
	NumDelivered uint64 // 1 on the first delivery

	msg        jetstream.Msg
	ackWait    time.Duration
	maxDeliver int

	mu      sync.Mutex
	settled bool
}

// Redelivered reports whether an earlier delivery of this job was not
// acknowledged (its coordinator stopped or released it).
func (d *Delivery) Redelivered() bool { return d.NumDelivered > 1 }

// LastAttempt reports whether the queue will not deliver this job again
// if this delivery is not acknowledged: the coordinator should end the job
// (failed) and Ack it rather than leave it stored forever.
func (d *Delivery) LastAttempt() bool {
	return d.maxDeliver > 0 && d.NumDelivered >= uint64(d.maxDeliver)
}

// InProgress tells the queue the job is still being worked on, resetting
// its ack timer.
func (d *Delivery) InProgress() error {
	if err := d.msg.InProgress(); err != nil {
		return fmt.Errorf("job %s: in-progress ack: %w", d.Job.JobID, err)
	}
	return nil
}

// KeepAlive sends InProgress every third of the ack wait until the delivery
// is settled or stop is called, so a long job is not redelivered. Errors
// are retried at the next tick: a missed signal costs nothing until the ack
// wait runs out.
func (d *Delivery) KeepAlive() (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	go func() {
		t := time.NewTicker(max(d.ackWait/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if d.isSettled() {
					return
				}
				_ = d.msg.InProgress()
			}
		}
	}()
	return func() { once.Do(func() { close(done) }) }
}

// Ack removes the job from the queue: it reached a final state. It waits
// for the server to confirm, so a job acknowledged is never run again.
func (d *Delivery) Ack(ctx context.Context) error {
	return d.settle(func() error { return d.msg.DoubleAck(ctx) }, "ack")
}

// Release puts the job back for another delivery after delay (a
// coordinator shutting down cleanly hands its jobs over without waiting for
// the ack wait).
func (d *Delivery) Release(delay time.Duration) error {
	return d.settle(func() error { return d.msg.NakWithDelay(delay) }, "release")
}

// Reject removes the job without running it; reason is kept in the
// server's advisory.
func (d *Delivery) Reject(reason string) error {
	return d.settle(func() error { return d.msg.TermWithReason(reason) }, "reject")
}

func (d *Delivery) settle(f func() error, what string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return fmt.Errorf("job %s: %s: delivery already settled", d.Job.JobID, what)
	}
	if err := f(); err != nil {
		return fmt.Errorf("job %s: %s: %w", d.Job.JobID, what, err)
	}
	d.settled = true
	return nil
}

func (d *Delivery) isSettled() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.settled
}

// Stored calls fn for every job stored in the queue, oldest first: those
// waiting and those delivered but not yet acknowledged. It reads the stream
// without consuming it, so that a coordinator that starts can list the
// jobs it has not taken yet. A stored message that does not decode is
// skipped (Next terminates it when it comes up).
func (q *JobQueue) Stored(ctx context.Context, fn func(*QueuedJob)) error {
	for seq := uint64(1); ; {
		raw, err := q.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(q.cfg.Subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("job queue: read stored jobs: %w", err)
		}
		seq = raw.Sequence + 1
		var job QueuedJob
		enc, err := EncodingOf(&nats.Msg{Header: raw.Header})
		if err == nil {
			err = Unmarshal(enc, raw.Data, &job)
		}
		if err == nil {
			fn(&job)
		}
	}
}
