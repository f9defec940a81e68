package openai

import (
	"context"
	"sync"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
)

// job is one request's job, followed by client.Run in its own goroutine.
// Run's handlers only queue what arrives, so a slow HTTP client never
// holds up the NATS subscriptions; the queue holds at most the job's
// events and its max_tokens tokens, so it is bounded by the request.
type job struct {
	id  string
	key string

	mu    sync.Mutex
	items []item
	wake  chan struct{}
	done  chan struct{}
	res   *client.Result
	err   error
}

type item struct {
	ev  *cp.JobEvent
	tok *cp.TokenMsg
}

// submit starts the job of pl; it runs until ctx ends.
func (s *Server) submit(ctx context.Context, pl *plan) *job {
	key := "http-" + cp.NewJobID()
	j := &job{id: cp.JobIDForKey(cp.ClientName(s.cfg.Conn), key), key: key, wake: make(chan struct{}, 1), done: make(chan struct{})}
	req := cp.SubmitRequest{TokenIDs: pl.prompt, Images: pl.images, Sampling: pl.sampling, IdempotencyKey: key, Policy: s.cfg.Policy}
	go func() {
		res, err := client.Run(ctx, s.cfg.Conn, req, client.Handlers{
			Event: func(ev cp.JobEvent) { j.push(item{ev: &ev}) },
			Token: func(t cp.TokenMsg) { j.push(item{tok: &t}) },
		})
		j.mu.Lock()
		j.res, j.err = res, err
		j.mu.Unlock()
		close(j.done)
	}()
	return j
}

func (j *job) push(it item) {
	j.mu.Lock()
	j.items = append(j.items, it)
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// take returns what arrived since the last call, and whether the job has
// ended (then nothing more will arrive).
func (j *job) take() ([]item, bool) {
	ended := false
	select {
	case <-j.done:
		ended = true
	default:
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	items := j.items
	j.items = nil
	return items, ended
}

func (j *job) result() (*client.Result, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.res, j.err
}
