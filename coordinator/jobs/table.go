package jobs

import (
	"slices"
	"sync"

	cp "github.com/tandem-inference/tandem/controlplane"
)

// Table keeps every job's latest event for listing and lookups: the jobs
// queued and running, and the most recent finished ones. It is safe for
// concurrent use.
type Table struct {
	keep int // finished jobs kept

	mu       sync.Mutex
	latest   map[string]cp.JobEvent
	owners   map[string]owner // job id -> the client that submitted it
	finished []string         // ids of finished jobs, oldest first
}

// NewTable keeps up to keep finished jobs (at least 1).
func NewTable(keep int) *Table {
	return &Table{keep: max(keep, 1), latest: map[string]cp.JobEvent{}, owners: map[string]owner{}}
}

// Record stores ev as its job's latest event, unless the table holds a
// later one (events of one job may be recorded from several goroutines).
func (t *Table) Record(ev cp.JobEvent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.latest[ev.JobID]
	if ok && old.Seq >= ev.Seq && !restarted(old, ev) {
		return
	}
	// The output stays with the results store, not in every list.
	ev.Output = nil
	t.latest[ev.JobID] = ev
	if ev.State.Final() && (!ok || !old.State.Final()) {
		t.finished = append(t.finished, ev.JobID)
		for len(t.finished) > t.keep {
			delete(t.latest, t.finished[0])
			delete(t.owners, t.finished[0])
			t.finished = t.finished[1:]
		}
	}
}

// restarted reports whether ev starts a new run of a job whose earlier run
// (another coordinator's delivery, stopped before its end) left old: the
// new run numbers its events from 1 again.
func restarted(old, ev cp.JobEvent) bool {
	return !old.State.Final() && ev.Seq <= old.Seq && ev.Time.After(old.Time)
}

// Get returns the latest event of job id.
func (t *Table) Get(id string) (cp.JobEvent, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev, ok := t.latest[id]
	return ev, ok
}

// owner is the client of a job and the encoding it submitted in.
type owner struct {
	client string
	enc    cp.Encoding
}

// Own records the client that submitted job id and the encoding of its
// submission (before the job's first event, so that every event of the
// job reaches the client, in the client's encoding).
func (t *Table) Own(id, client string, enc cp.Encoding) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.owners[id] = owner{client, enc}
}

// Owner returns the client that submitted job id.
func (t *Table) Owner(id string) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.owners[id]
	return o.client, ok
}

// Encoding returns the encoding job id's client submitted it in: its
// events go to the client in it.
func (t *Table) Encoding(id string) cp.Encoding {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.owners[id].enc
}

// List returns the latest event of each job of client owner (every job's
// when owner is empty; only those in state, when given), newest submission
// first, at most limit of them.
func (t *Table) List(owner string, state cp.JobState, limit int) []cp.JobEvent {
	t.mu.Lock()
	out := make([]cp.JobEvent, 0, len(t.latest))
	for id, ev := range t.latest {
		if owner != "" && t.owners[id].client != owner {
			continue
		}
		if state == "" || ev.State == state {
			out = append(out, ev)
		}
	}
	t.mu.Unlock()
	return NewestFirst(out, limit)
}

// NewestFirst sorts events by submission, newest first (ties by job id),
// and keeps at most limit of them (limit <= 0: all).
func NewestFirst(evs []cp.JobEvent, limit int) []cp.JobEvent {
	slices.SortFunc(evs, func(a, b cp.JobEvent) int {
		if c := b.Submitted.Compare(a.Submitted); c != 0 {
			return c
		}
		switch {
		case a.JobID < b.JobID:
			return -1
		case a.JobID > b.JobID:
			return 1
		}
		return 0
	})
	if limit > 0 && len(evs) > limit {
		evs = evs[:limit]
	}
	return evs
}

// Counts returns how many jobs the table holds in each state.
func (t *Table) Counts() map[cp.JobState]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := map[cp.JobState]int{}
	for _, ev := range t.latest {
		n[ev.State]++
	}
	return n
}

// Forget drops job id (a submission that was never queued).
func (t *Table) Forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.latest, id)
	delete(t.owners, id)
}
