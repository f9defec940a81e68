package controlplane

// Subjects of protocol version 1. Every subject tandem uses starts with
// Prefix; per-job and per-worker subjects embed an id checked by CheckID, so
// an id can never add a token or a wildcard to a subject.
const (
	// Prefix is the root of every tandem subject of this protocol version.
	Prefix = "tandem.v1"

	// SubjectSubmit takes a SubmitRequest and answers a SubmitReply
	// (request-reply, served by the coordinators' queue group).
	SubjectSubmit = Prefix + ".jobs.submit"
	// SubjectCancel takes a CancelRequest and answers a CancelReply.
	SubjectCancel = Prefix + ".jobs.cancel"
	// SubjectListJobs takes a ListJobsRequest and answers a ListJobsReply.
	SubjectListJobs = Prefix + ".jobs.list"

	// SubjectJobQueue is where accepted submissions are stored (QueuedJob
	// messages in the JetStream work-queue stream). Clients never publish
	// here: the coordinator does, after validating a SubmitRequest.
	SubjectJobQueue = Prefix + ".queue.jobs"

	// SubjectAllJobEvents, SubjectAllJobTokens and SubjectAllJobProgress
	// match the per-job subjects of every job (for the coordinator and
	// monitoring).
	SubjectAllJobEvents   = Prefix + ".jobs.*.events"
	SubjectAllJobTokens   = Prefix + ".jobs.*.tokens"
	SubjectAllJobProgress = Prefix + ".jobs.*.progress"

	// QueueGroupCoordinators is the queue group coordinators serve the
	// request subjects in, so that several coordinators share the load and
	// each request is answered once.
	QueueGroupCoordinators = "tandem-coordinators"

	// WorkersBucket is the JetStream key-value bucket of the worker
	// registry: key = worker id, value = WorkerInfo. A worker's heartbeat
	// is a put of its key (see HeartbeatSubject).
	WorkersBucket = "tandem-v1-workers"
	// JobsStream is the JetStream stream behind the job queue.
	JobsStream = "TANDEM_V1_JOBS"
	// JobsConsumer is the durable pull consumer the coordinators share.
	JobsConsumer = "tandem-coordinators"
)

// JobEvents is the subject on which the coordinator publishes JobEvent
// messages for job id.
func JobEvents(jobID string) string { return Prefix + ".jobs." + jobID + ".events" }

// JobTokens is the subject on which the decode group's last rank publishes
// TokenMsg messages for job id.
func JobTokens(jobID string) string { return Prefix + ".jobs." + jobID + ".tokens" }

// JobProgress is the subject on which workers report Progress for job id to
// the coordinator.
func JobProgress(jobID string) string { return Prefix + ".jobs." + jobID + ".progress" }

// WorkerAssign is the request subject on which worker id takes an Assignment
// and answers an AssignReply.
func WorkerAssign(workerID string) string { return Prefix + ".workers." + workerID + ".assign" }

// WorkerCancel is the request subject on which worker id takes a
// CancelRequest for one of its jobs and answers a CancelReply once the job's
// memory is freed.
func WorkerCancel(workerID string) string { return Prefix + ".workers." + workerID + ".cancel" }

// HeartbeatSubject is the subject a heartbeat of worker id is stored under:
// the registry bucket's key subject. Any NATS client can follow heartbeats
// with `nats kv watch tandem-v1-workers` or a subscription on
// "$KV.tandem-v1-workers.>".
func HeartbeatSubject(workerID string) string { return "$KV." + WorkersBucket + "." + workerID }
