package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/sink"
)

// Spec is a job as submitted.
type Spec struct {
	ID string
	// Tokens are the tokens to prefill: the prompt without its last token
	// (the decode side runs that one as its first step). Empty is allowed:
	// the sink then gets every layer's empty state.
	Tokens []int32
	// Media are the feature rows of the images in Tokens (positions count
	// from Tokens[0]); each pass takes its piece's window of them.
	Media []model.Media
	// Images are the images' pad runs in Tokens and their hashes: the
	// prefix store keys an image's rows by its hash (prefixkey.Fold).
	Images []prefixkey.Image
	// Encode, when set, computes Media (runs the vision tower): the job
	// waits for it, off the pass loop, before it joins a pass; an error
	// fails the job, and cancelling the job cancels its context.
	Encode func(ctx context.Context) ([]model.Media, error)
	// Base, when set, is the state of the tokens before Tokens (a stored
	// prefix, every layer, Base.Tokens a multiple of the KDA chunk): the
	// job continues from it, and the sink gets the state of both.
	Base *model.SeqState
	// Sink receives the state layer by layer; the job owns it until done.
	Sink model.LayerSink
	// Progress, if set, is called after every layer of every pass the job
	// is in, from the pass goroutine (keep it short).
	Progress func(Progress)
	// Deadline, if set, fails the job when it passes.
	Deadline time.Time
}

// Progress is a job's position.
type Progress struct {
	Job           string
	Pass          int
	Layer, Layers int // layers done in this pass
	// Tokens done before this pass, in this pass, and in the whole prompt.
	Done, InPass, Total int
	// Cached tokens came from the job's Base (not prefilled).
	Cached       int
	ReadGBps     float64
	Elapsed, ETA time.Duration // of this pass
	Final        bool          // this pass ends the prompt
}

// Result is how a job went.
type Result struct {
	Tokens int // prefilled (after Base)
	Cached int // taken from Base
	Passes int
	// Wait is submit to the first pass start; Prefill the first pass start
	// to the state's commit by the sink.
	Wait, Prefill time.Duration
	Err           error
}

// Job is a submitted job.
type Job struct {
	spec       Spec
	ctx        context.Context
	cancel     context.CancelCauseFunc
	submitted  time.Time
	baseTokens int

	// Owned by the scheduler loop.
	state   *model.SeqState
	out     *sink.Queue
	done    int
	passes  int
	started time.Time
	// committing: every layer went to the sink queue; waiting for the sink.
	committing bool

	once   sync.Once
	finish chan struct{}
	result Result
}

// ID is the job's id.
func (j *Job) ID() string { return j.spec.ID }

// Done is closed when the job has finished, one way or the other.
func (j *Job) Done() <-chan struct{} { return j.finish }

// Wait waits for the job (or ctx) and returns its error.
func (j *Job) Wait(ctx context.Context) error {
	select {
	case <-j.finish:
		return j.result.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Result is the job's outcome; valid once Done is closed.
func (j *Job) Result() Result {
	<-j.finish
	return j.result
}

// ErrCancelled is the cause of jobs cancelled through the scheduler.
var ErrCancelled = errors.New("job cancelled")

// settle records the outcome and releases the job's waiters; a failure
// aborts its sink. The scheduler calls it once (finish).
func (j *Job) settle(err error) {
	if err != nil {
		if j.out != nil {
			j.out.Abort(err)
		} else if j.spec.Sink != nil {
			j.spec.Sink.Abort(err)
		}
	}
	j.result.Err = err
	j.result.Tokens = len(j.spec.Tokens)
	j.result.Cached = j.base()
	j.result.Passes = j.passes
	if !j.started.IsZero() {
		j.result.Wait = j.started.Sub(j.submitted)
		j.result.Prefill = time.Since(j.started)
	} else {
		j.result.Wait = time.Since(j.submitted)
	}
	j.cancel(err)
	close(j.finish)
}

// base is the tokens the job's state starts with (Base.Tokens at submit:
// the state itself grows as the job runs).
func (j *Job) base() int { return j.baseTokens }

func (j *Job) finished() bool {
	select {
	case <-j.finish:
		return true
	default:
		return false
	}
}
