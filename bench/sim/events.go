package sim

import (
	"container/heap"
	"context"
	"fmt"
	"time"
)

// Loop is a discrete-event loop: actions scheduled at simulated times run in
// time order, and actions at the same time in the order they were
// scheduled, so a run is deterministic.
type Loop struct {
	now time.Duration
	q   eventQueue
	seq uint64
	ran int
}

type event struct {
	at  time.Duration
	seq uint64
	do  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(a, b int) bool {
	if q[a].at != q[b].at {
		return q[a].at < q[b].at
	}
	return q[a].seq < q[b].seq
}
func (q eventQueue) Swap(a, b int) { q[a], q[b] = q[b], q[a] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Now is the simulated time.
func (l *Loop) Now() time.Duration { return l.now }

// At schedules do at time t; a time in the past means now (the loop never
// goes back).
func (l *Loop) At(t time.Duration, do func()) {
	l.seq++
	heap.Push(&l.q, event{at: max(t, l.now), seq: l.seq, do: do})
}

// After schedules do d from now.
func (l *Loop) After(d time.Duration, do func()) { l.At(l.now+d, do) }

// Pending is the number of scheduled actions.
func (l *Loop) Pending() int { return len(l.q) }

// Ran is the number of actions run so far.
func (l *Loop) Ran() int { return l.ran }

// Run runs actions until none is left. It stops with an error after
// maxEvents actions (a model that keeps scheduling forever) or when ctx
// ends; maxEvents <= 0 means no limit.
func (l *Loop) Run(ctx context.Context, maxEvents int) error {
	for len(l.q) > 0 {
		if maxEvents > 0 && l.ran >= maxEvents {
			return fmt.Errorf("sim: stopped after %d events at t=%v with %d still scheduled", l.ran, l.now, len(l.q))
		}
		if l.ran%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("sim: stopped at t=%v: %w", l.now, err)
			}
		}
		e := heap.Pop(&l.q).(event)
		l.now = e.at
		l.ran++
		e.do()
	}
	return nil
}
