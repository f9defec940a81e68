package openai

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
)

// availability asks the coordinators whether a decode group serves the
// model (cp.Availability, on the client's own subjects: a client identity
// may not read the worker registry), so that a request nobody could run
// gets 503 at once, saying why, instead of waiting in the queue for the
// placement timeout. An answer is kept for fresh; while one is asked,
// every request waits for that one, so a burst costs one round trip.
type availability struct {
	nc    *nats.Conn
	model string
	fresh time.Duration
	wait  time.Duration // bound on one request

	mu       sync.Mutex
	at       time.Time
	rep      *cp.AvailabilityReply // nil: unknown (no answer)
	inFlight chan struct{}         // closed when the request out is answered
}

// Defaults of the availability cache.
const (
	availabilityFresh = time.Second
	availabilityWait  = 2 * time.Second
)

func newAvailability(nc *nats.Conn, model string) *availability {
	return &availability{nc: nc, model: model, fresh: availabilityFresh, wait: availabilityWait}
}

// get returns the latest answer (nil: none, the coordinators did not
// answer), asking again when it is older than fresh.
func (a *availability) get(ctx context.Context) *cp.AvailabilityReply {
	a.mu.Lock()
	if !a.at.IsZero() && time.Since(a.at) < a.fresh {
		rep := a.rep
		a.mu.Unlock()
		return rep
	}
	ch := a.inFlight
	if ch == nil {
		ch = make(chan struct{})
		a.inFlight = ch
		go a.ask(ch)
	}
	a.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rep
}

func (a *availability) ask(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), a.wait)
	defer cancel()
	rep, err := cp.Availability(ctx, a.nc)
	if err != nil {
		rep = nil
	}
	a.mu.Lock()
	a.rep, a.at, a.inFlight = rep, time.Now(), nil
	a.mu.Unlock()
	close(done)
}

// check returns the 503 to answer when the coordinators say no job of the
// model could be placed now, nil otherwise. Without an answer (no
// coordinator answered in time, or one too old to know the request) the
// job is submitted and the coordinator decides.
func (a *availability) check(ctx context.Context) *apiError {
	rep := a.get(ctx)
	if rep == nil {
		return nil
	}
	if !modelinfo.Match(a.model, rep.Model) {
		return noWorkers(fmt.Sprintf("the coordinators serve model %s, this front door %s", rep.Model, a.model))
	}
	if ok, why := rep.Available(); !ok {
		return noWorkers(why)
	}
	return nil
}

// ranks is the number of ready decode ranks of the model; known is false
// without an answer.
func (a *availability) ranks(ctx context.Context) (n int, known bool) {
	rep := a.get(ctx)
	if rep == nil {
		return 0, false
	}
	if !modelinfo.Match(a.model, rep.Model) {
		return 0, true
	}
	return rep.DecodeRanks, true
}

// errNoAnswer is what the health check says without an answer.
var errNoAnswer = errors.New("no coordinator answered the availability request")
