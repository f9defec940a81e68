package controlplane

import (
	"sync"
	"time"
)

// Ended remembers the final reports of the jobs a worker ended recently,
// bounded in number and age. A coordinator that takes a job over after
// its predecessor crashed asks the workers (JobStatusRequest, or the same
// Assignment again) and learns how the job ended there, instead of
// running it a second time. Safe for concurrent use.
type Ended struct {
	max int
	ttl time.Duration

	mu    sync.Mutex
	m     map[string]endedJob
	order []string // oldest first; may name jobs already dropped
}

type endedJob struct {
	p  Progress
	at time.Time
}

// NewEnded keeps up to max reports (default 4096) for ttl (default 1 h).
func NewEnded(max int, ttl time.Duration) *Ended {
	if max <= 0 {
		max = 4096
	}
	if ttl <= 0 {
		ttl = time.Hour
	}
	return &Ended{max: max, ttl: ttl, m: map[string]endedJob{}}
}

// Put records p, a final report, at now.
func (e *Ended) Put(p *Progress, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, had := e.m[p.JobID]; !had {
		e.order = append(e.order, p.JobID)
	}
	e.m[p.JobID] = endedJob{p: *p, at: now}
	for len(e.m) > e.max || (len(e.order) > 0 && e.expired(e.order[0], now)) {
		delete(e.m, e.order[0])
		e.order = e.order[1:]
	}
	if len(e.order) > 2*e.max {
		// Compact ids dropped out of turn.
		keep := e.order[:0]
		for _, id := range e.order {
			if _, ok := e.m[id]; ok {
				keep = append(keep, id)
			}
		}
		e.order = keep
	}
}

func (e *Ended) expired(id string, now time.Time) bool {
	j, ok := e.m[id]
	return !ok || now.Sub(j.at) > e.ttl
}

// Get returns job's final report, if it ended within the retention.
func (e *Ended) Get(job string, now time.Time) (*Progress, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	j, ok := e.m[job]
	if !ok || now.Sub(j.at) > e.ttl {
		return nil, false
	}
	p := j.p
	return &p, true
}

// Drop forgets job (it is admitted again).
func (e *Ended) Drop(job string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, job)
}
