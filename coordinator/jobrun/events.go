package jobrun

import (
	"time"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// Event is something that happened to a run.
type Event interface{ event() }

// Delivery is what the queue says of this delivery of the job.
type Delivery struct {
	// NumDelivered counts the deliveries, this one included; above 1, an
	// earlier one may have assigned the job.
	NumDelivered uint64
	// LastAttempt says the queue will not deliver the job again.
	LastAttempt bool
	// Cancelled is a client's reason when the job was cancelled while
	// queued, or "" when it was not.
	Cancelled string
	// Refused says the stored request does not pass this coordinator's
	// admission, with other limits or another model.
	Refused *cp.JobError
}

// Start begins the run.
type Start struct {
	At       time.Time
	Delivery Delivery
}

// WorkerReport is one worker's answer to Inquire.
type WorkerReport struct {
	Worker string
	Kind   cp.WorkerKind
	// Group and Ranks are a decode group's id and every rank's worker id.
	Group string
	Ranks []string
	Reply *cp.JobStatusReply // nil: no answer
}

// Inquired carries the workers' answers to Inquire.
type Inquired struct {
	At      time.Time
	Reports []WorkerReport
}

// Plan is a placement the driver found: the route and both assignments,
// which the driver built with their transfer session and secret.
type Plan struct {
	Route  *cp.RouteDecision
	Group  string
	Head   string   // the decode group's rank 0
	Ranks  []string // every rank of the group
	Decode *cp.Assignment
	// Prefill and PrefillAssignment are the prefill worker of a remote job,
	// "" and nil for a local one.
	Prefill           string
	PrefillAssignment *cp.Assignment
}

// Candidate answers Place: a Plan, or why there is none now.
type Candidate struct {
	At   time.Time
	Plan *Plan
	Why  string
	// Unreachable names a prefill worker that did not answer, which the
	// next tries, after a pause, leave out.
	Unreachable string
}

// Assigned answers Assign: the worker's reply, or the request's failure.
type Assigned struct {
	At    time.Time
	Reply *cp.AssignReply
	// NoResponders says nobody serves the worker's assign subject.
	NoResponders bool
	Err          error
	// Lost is the reason the registry lost the worker while the assignment
	// was unanswered; the request was abandoned.
	Lost string
}

// Report is a worker's progress report on the job.
type Report struct {
	At time.Time // when the coordinator received it
	P  *cp.Progress

	prefillOpen bool // adopting a prefill side that ended
}

// WorkerLost says the registry lost a worker that left, expired or
// restarted.
type WorkerLost struct {
	At     time.Time
	Worker string
	Reason string
	Since  time.Time // when the registry recorded it
	// Left says the worker deregistered. A worker leaves after publishing
	// its final reports, but they come on another subscription than the
	// registry's changes, so they may still be on their way.
	Left bool
}

// WorkersChanged says the registry changed; a job waiting for workers
// tries again.
type WorkersChanged struct{ At time.Time }

// Cancel is a client's cancellation.
type Cancel struct {
	At     time.Time
	Reason string
}

// Checked answers Check with the worker's account of the job, or with Err
// when there is none, as from a worker that does not answer or does not
// serve status.
type Checked struct {
	At    time.Time
	Reply *cp.JobStatusReply
	Err   error
}

// Reconnected says the coordinator's NATS connection came back after a
// loss. Reports published while it was away never reached it, since core
// NATS keeps nothing for a missing subscriber, so a run that follows a job
// asks the job's decode group how it stands.
type Reconnected struct{ At time.Time }

// Tick says the time Next named has come.
type Tick struct{ At time.Time }

// Shutdown says the coordinator is stopping.
type Shutdown struct{ At time.Time }

func (Start) event()          {}
func (Inquired) event()       {}
func (Candidate) event()      {}
func (Assigned) event()       {}
func (Report) event()         {}
func (WorkerLost) event()     {}
func (WorkersChanged) event() {}
func (Cancel) event()         {}
func (Checked) event()        {}
func (Reconnected) event()    {}
func (Tick) event()           {}
func (Shutdown) event()       {}

// Action is something the driver must do.
type Action interface{ action() }

// Publish announces and records a job event. A final event is stored in
// the results before it is published.
type Publish struct{ Event cp.JobEvent }

// Inquire asks every decode group's rank 0 and every prefill worker of the
// model what they know of the job; the answers come back as Inquired.
type Inquire struct{}

// Place asks for a placement, answered as a Candidate, leaving out the
// prefill workers named.
type Place struct{ Exclude []string }

// Assign sends an assignment; the answer comes back as Assigned.
type Assign struct {
	Worker     string
	Assignment *cp.Assignment
}

// Check asks worker, the decode group's head, by its status request what
// it knows of the job; the answer comes back as Checked. A run asks before
// it fails a job that went silent and after the coordinator's connection
// came back, so that a lost report neither fails nor hangs a job that runs
// or ended well.
type Check struct{ Worker string }

// CancelOn tells workers to drop the job.
type CancelOn struct {
	Workers []string
	Reason  string
}

// ReplyCancel answers the client's cancellation; Late says the job had
// ended before it.
type ReplyCancel struct {
	State cp.JobState
	Late  bool
}

// ObservePass, ObserveTransfer, ObserveDecodeStep and ObserveLocalPrefill
// feed a finished job's measured figures to the cost model.
type ObservePass struct {
	Floor, Compute time.Duration
	Tokens         int
}

type ObserveTransfer struct{ BytesPerSec int64 }

type ObserveDecodeStep struct{ Step time.Duration }

type ObserveLocalPrefill struct {
	Tokens int
	Time   time.Duration
}

// LoadPrefill, LoadLocal, LoadProgress and LoadForget keep the router's
// view of the queues in front of new jobs.
type LoadPrefill struct {
	Worker string
	Tokens int
}

type LoadLocal struct {
	Group  string
	Tokens int
}

type LoadProgress struct {
	Worker      string
	Done, Total int
}

type LoadForget struct{}

// AssignedAt says both sides took the job, Latency after its submission.
type AssignedAt struct{ Latency time.Duration }

// Settle ends the delivery: Ack when the job reached a final state, else
// hand it back to the queue.
type Settle struct{ Ack bool }

// Bug says the run tried a move the lifecycle forbids, a coordinator bug
// to be logged.
type Bug struct{ Err error }

func (Publish) action()             {}
func (Inquire) action()             {}
func (Place) action()               {}
func (Assign) action()              {}
func (Check) action()               {}
func (CancelOn) action()            {}
func (ReplyCancel) action()         {}
func (ObservePass) action()         {}
func (ObserveTransfer) action()     {}
func (ObserveDecodeStep) action()   {}
func (ObserveLocalPrefill) action() {}
func (LoadPrefill) action()         {}
func (LoadLocal) action()           {}
func (LoadProgress) action()        {}
func (LoadForget) action()          {}
func (AssignedAt) action()          {}
func (Settle) action()              {}
func (Bug) action()                 {}
