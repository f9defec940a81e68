package controlplane

import (
	"fmt"
	"strings"
)

// Subjects of protocol version 1. Every subject tandem uses starts with
// Prefix; per-job and per-worker subjects embed an id checked by CheckID, so
// an id can never add a token or a wildcard to a subject.
const (
	// Prefix is the root of every tandem subject of this protocol version.
	Prefix = "tandem.v1"

	// SubjectAllSubmit, SubjectAllCancel, SubjectAllList and
	// SubjectAllAvailability match every client's requests (ClientSubmit,
	// ClientCancel, ClientList, ClientAvailability): the
	// coordinators serve them, and learn from the subject which client
	// asks (the NATS server lets a client publish only under its own
	// ClientPrefix).
	SubjectAllSubmit       = Prefix + ".clients.*.submit"
	SubjectAllCancel       = Prefix + ".clients.*.cancel"
	SubjectAllList         = Prefix + ".clients.*.list"
	SubjectAllAvailability = Prefix + ".clients.*.availability"

	// SubjectJobQueue is where accepted submissions are stored (QueuedJob
	// messages in the JetStream work-queue stream). Clients never publish
	// here: the coordinator does, after validating a SubmitRequest.
	SubjectJobQueue = Prefix + ".queue.jobs"

	// SubjectAllProgress matches every worker's progress reports
	// (WorkerProgress), for the coordinator.
	SubjectAllProgress = Prefix + ".workers.*.jobs.*.progress"

	// QueueGroupCoordinators is the queue group coordinators serve the
	// request subjects in, so that several coordinators share the load and
	// each request is answered once.
	QueueGroupCoordinators = "tandem-coordinators"

	// WorkersBucket is the JetStream key-value bucket of the worker
	// registry: key = worker id, value = WorkerInfo. A worker's heartbeat
	// is a put of its key (see HeartbeatSubject).
	WorkersBucket = "tandem-v1-workers"
	// ResultsBucket is the JetStream key-value bucket of finished jobs:
	// key = job id, value = the job's final JobEvent.
	ResultsBucket = "tandem-v1-results"
	// JobsStream is the JetStream stream behind the job queue.
	JobsStream = "TANDEM_V1_JOBS"
	// JobsConsumer is the durable pull consumer the coordinators share.
	JobsConsumer = "tandem-coordinators"
)

// ClientSubmit is the subject on which client name submits jobs: a
// SubmitRequest answered by a SubmitReply.
func ClientSubmit(name string) string { return ClientPrefix(name) + ".submit" }

// ClientCancel is the subject on which client name cancels one of its jobs:
// a CancelRequest answered by a CancelReply.
func ClientCancel(name string) string { return ClientPrefix(name) + ".cancel" }

// ClientList is the subject on which client name lists its jobs: a
// ListJobsRequest answered by a ListJobsReply.
func ClientList(name string) string { return ClientPrefix(name) + ".list" }

// ClientAvailability is the subject on which client name asks what the
// deployment can run now: an AvailabilityRequest answered by an
// AvailabilityReply.
func ClientAvailability(name string) string { return ClientPrefix(name) + ".availability" }

// ClientJobEvents is the subject on which the coordinator publishes the
// JobEvent messages of job id, a job of client name.
func ClientJobEvents(name, jobID string) string {
	return ClientPrefix(name) + ".jobs." + jobID + ".events"
}

// ClientJobTokens is the subject on which the decode group's rank 0
// publishes the TokenMsg messages of job id, a job of client name.
func ClientJobTokens(name, jobID string) string {
	return ClientPrefix(name) + ".jobs." + jobID + ".tokens"
}

// ClientAllJobEvents and ClientAllJobTokens match the events and tokens
// of every job of client name (what that client may watch).
func ClientAllJobEvents(name string) string { return ClientPrefix(name) + ".jobs.*.events" }
func ClientAllJobTokens(name string) string { return ClientPrefix(name) + ".jobs.*.tokens" }

// ClientOf returns the client whose request subject (ClientSubmit,
// ClientCancel, ClientList or ClientAvailability) subject is.
func ClientOf(subject string) (string, error) {
	rest, ok := strings.CutPrefix(subject, Prefix+".clients.")
	name, verb, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || (verb != "submit" && verb != "cancel" && verb != "list" && verb != "availability") {
		return "", fmt.Errorf("subject %q is not a client request subject (%s.<client>.submit|cancel|list|availability)", subject, Prefix+".clients")
	}
	if err := CheckID(name); err != nil {
		return "", fmt.Errorf("subject %q: client name: %w", subject, err)
	}
	return name, nil
}

// WorkerProgress is the subject on which worker reports Progress on job id
// to the coordinator. The worker's id in the subject is what a worker
// identity with a name is limited to, so the coordinator checks the report
// against it (ProgressSender).
func WorkerProgress(worker, jobID string) string {
	return Prefix + ".workers." + worker + ".jobs." + jobID + ".progress"
}

// ProgressSender returns the worker and job a progress subject names.
func ProgressSender(subject string) (worker, job string, err error) {
	parts := strings.Split(subject, ".")
	// tandem . v1 . workers . <worker> . jobs . <job> . progress
	if len(parts) != 7 || parts[0]+"."+parts[1] != Prefix || parts[2] != "workers" || parts[4] != "jobs" || parts[6] != "progress" {
		return "", "", fmt.Errorf("subject %q is not a progress subject (%s)", subject, SubjectAllProgress)
	}
	return parts[3], parts[5], nil
}

// WorkerAssign is the request subject on which worker id takes an Assignment
// and answers an AssignReply.
func WorkerAssign(workerID string) string { return Prefix + ".workers." + workerID + ".assign" }

// WorkerCancel is the request subject on which worker id takes a
// CancelRequest for one of its jobs and answers a CancelReply once the job's
// memory is freed.
func WorkerCancel(workerID string) string { return Prefix + ".workers." + workerID + ".cancel" }

// WorkerStatus is the request subject on which worker id takes a
// JobStatusRequest and answers a JobStatusReply: whether it holds the job
// or ended it recently.
func WorkerStatus(workerID string) string { return Prefix + ".workers." + workerID + ".status" }

// HeartbeatSubject is the subject a heartbeat of worker id is stored under:
// the registry bucket's key subject. Any NATS client can follow heartbeats
// with `nats kv watch tandem-v1-workers` or a subscription on
// "$KV.tandem-v1-workers.>" (with the coordinator's identity: workers and
// clients may not read the registry).
func HeartbeatSubject(workerID string) string { return "$KV." + WorkersBucket + "." + workerID }

// CheckClientReply checks the reply subject of a client request on subject,
// one of ClientSubmit, ClientCancel, ClientList and ClientAvailability. It
// accepts only the asking client's own inbox: InboxPrefix(PrincipalClient,
// client) followed by one or more plain tokens, without wildcards or white
// space, where client is the one the subject names. A request that fails
// the check must be dropped unanswered, since the coordinator's reply
// would otherwise publish with its own permissions; docs/ARCHITECTURE.md,
// "Security", has the reason.
func CheckClientReply(subject, reply string) error {
	client, err := ClientOf(subject)
	if err != nil {
		return err
	}
	inbox := InboxPrefix(PrincipalClient, client) + "."
	rest, ok := strings.CutPrefix(reply, inbox)
	if !ok || rest == "" {
		return fmt.Errorf("reply subject %q of a request on %s is not under the client's own inbox %s>", reply, subject, inbox)
	}
	for tok := range strings.SplitSeq(rest, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("reply subject %q of a request on %s is not a plain subject", reply, subject)
		}
	}
	return nil
}
