package service

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/metrics"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/costmodel"
)

// view is the coordinator's picture of the worker registry, kept current
// by the registry watch.
type view struct {
	mu      sync.Mutex
	workers map[string]cp.WorkerInfo
	changed chan struct{} // closed (and replaced) at every change
	synced  chan struct{} // closed once the registry's workers were listed
	once    sync.Once
}

func newView() *view {
	return &view{workers: map[string]cp.WorkerInfo{}, changed: make(chan struct{}), synced: make(chan struct{})}
}

// snapshot returns the live workers and a channel closed at the next change.
func (v *view) snapshot() (map[string]cp.WorkerInfo, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string]cp.WorkerInfo, len(v.workers))
	for id, w := range v.workers {
		out[id] = w
	}
	return out, v.changed
}

func (v *view) notifyLocked() {
	close(v.changed)
	v.changed = make(chan struct{})
}

// watch follows the registry: workers coming, beating, leaving and
// expiring. A worker that leaves, expires or restarts (a new start time
// under the same id) takes its running jobs with it. Besides the server's
// expiry markers, the coordinator sweeps for workers silent longer than
// the TTL itself, so that a dead worker is noticed within TTL + TTL/4
// whatever the server's expiry timing.
func (c *Coordinator) watch(changes <-chan cp.WorkerChange) {
	ttl := c.reg.TTL()
	sweep := time.NewTicker(ttl / 4)
	defer sweep.Stop()
	seen := map[string]time.Time{} // when the registry last recorded each worker
	heard := time.Now()            // when the watch last delivered anything
	for {
		var lost map[string]loss
		var since time.Time
		select {
		case ch, ok := <-changes:
			if !ok {
				return
			}
			heard = time.Now()
			lost = c.apply(ch, seen)
			since = ch.Time
		case now := <-sweep.C:
			if now.Sub(heard) > ttl/2 {
				// Nothing at all for half a TTL while workers beat every
				// third: the watch is what went silent (this coordinator
				// reconnecting, the bucket electing a leader), not the
				// workers. The server's expiry markers still come for
				// workers that died meanwhile.
				continue
			}
			since = now
			v := c.view
			v.mu.Lock()
			for id, at := range seen {
				if now.Sub(at) > ttl {
					delete(v.workers, id)
					delete(seen, id)
					if lost == nil {
						lost = map[string]loss{}
					}
					lost[id] = loss{reason: fmt.Sprintf("heartbeat expired: no heartbeat for %v, presumed dead", now.Sub(at).Round(time.Millisecond))}
				}
			}
			if lost != nil {
				v.notifyLocked()
			}
			v.mu.Unlock()
		}
		for id, l := range lost {
			c.workerLost(id, l, since)
		}
	}
}

// loss is why the registry lost a worker. left: it deregistered, a clean
// exit that comes after its final reports (which this coordinator may
// still read after the loss: they come on another subscription).
type loss struct {
	reason string
	left   bool
}

// apply records one registry change and returns the workers it lost.
func (c *Coordinator) apply(ch cp.WorkerChange, seen map[string]time.Time) map[string]loss {
	var gone, reason string
	var left bool
	v := c.view
	v.mu.Lock()
	defer func() {
		counts := map[cp.WorkerKind]int{}
		caches := map[string]metrics.PrefixCache{}
		for _, w := range v.workers {
			counts[w.Kind]++
			if c := w.PrefixCache; c != nil {
				caches[w.ID] = metrics.PrefixCache{Entries: c.Entries, Bytes: c.Bytes, Lookups: c.Lookups, Hits: c.Hits,
					HitTokens: c.HitTokens, Misses: c.Misses, Evictions: c.Evictions}
			}
		}
		v.notifyLocked()
		v.mu.Unlock()
		c.m.Workers(string(cp.KindPrefill), counts[cp.KindPrefill])
		c.m.Workers(string(cp.KindDecode), counts[cp.KindDecode])
		c.m.PrefixCaches(caches)
	}()
	switch ch.Op {
	case cp.WorkerSynced:
		v.once.Do(func() { close(v.synced) })
	case cp.WorkerUp:
		old, had := v.workers[ch.ID]
		v.workers[ch.ID] = *ch.Info
		seen[ch.ID] = ch.Time
		if had && !old.Started.Equal(ch.Info.Started) {
			gone, reason = ch.ID, fmt.Sprintf("restarted at %s: the jobs of its previous run are lost", ch.Info.Started.Format("15:04:05.000"))
		}
		if !had {
			c.log.Info("worker up", zap.String("worker", ch.ID), zap.String("kind", string(ch.Info.Kind)),
				zap.String("group", ch.Info.GroupID), zap.Int("rank", ch.Info.Rank), zap.String("model", ch.Info.Model))
		}
	case cp.WorkerLeft:
		if _, had := v.workers[ch.ID]; had {
			gone, reason, left = ch.ID, "left the registry (shut down)", true
		}
		delete(v.workers, ch.ID)
		delete(seen, ch.ID)
	case cp.WorkerExpired:
		if _, had := v.workers[ch.ID]; had {
			gone, reason = ch.ID, fmt.Sprintf("heartbeat expired: no heartbeat for %v, presumed dead", c.reg.TTL())
		}
		delete(v.workers, ch.ID)
		delete(seen, ch.ID)
	case cp.WorkerInvalid:
		c.log.Warn("undecodable worker registration", zap.String("worker", ch.ID), zap.Error(ch.Err))
	}
	if gone == "" {
		return nil
	}
	return map[string]loss{gone: {reason: reason, left: left}}
}

// workerLost tells every run that involves worker id. since is when the
// registry recorded the change: a run that sent the worker its assignment
// after a restart was recorded talks to the new process, and is not
// affected.
func (c *Coordinator) workerLost(id string, l loss, since time.Time) {
	c.log.Info("worker gone", zap.String("worker", id), zap.String("reason", l.reason))
	c.losses.notify(id, l.reason, since)
	c.mu.Lock()
	var affected []*run
	for _, r := range c.runs {
		affected = append(affected, r)
	}
	c.mu.Unlock()
	for _, r := range affected {
		r.inbox.put(message{lost: id, reason: l.reason, left: l.left, since: since})
	}
}

// group is a decode group as the registry shows it.
type group struct {
	ID    string
	Ranks []cp.WorkerInfo // by rank
	// Capacity is the longest sequence the group can hold when idle (its
	// ranks' memory budgets); Free what it can take now (0 when the
	// ranks do not say).
	Capacity, Free int
	Active         int
}

// Head is rank 0, the group's front door.
func (g *group) Head() cp.WorkerInfo { return g.Ranks[0] }

// stages are the pipeline stages' layers in ring order: the pipeline the
// group's prefill flows through (a stage's tensor ranks run its layers
// together, so each stage counts once).
func (g *group) stages() []costmodel.Stage {
	var s []costmodel.Stage
	for _, w := range g.Ranks {
		if w.TensorRank == 0 {
			s = append(s, costmodel.Stage{First: w.Layers.First, End: w.Layers.End})
		}
	}
	return s
}

// Workers are the ids of every rank.
func (g *group) Workers() []string {
	ids := make([]string, len(g.Ranks))
	for i, r := range g.Ranks {
		ids[i] = r.ID
	}
	return ids
}

// groups assembles the decode groups of the model from the registry. A
// group is usable when every rank is registered, ready, and the ranks'
// layers tile the model; the others are described in problems.
func groups(workers map[string]cp.WorkerInfo, m *modelinfo.Info) (usable []group, problems []string) {
	by := map[string][]cp.WorkerInfo{}
	for _, w := range workers {
		if w.Kind == cp.KindDecode {
			by[w.GroupID] = append(by[w.GroupID], w)
		}
	}
	ids := make([]string, 0, len(by))
	for id := range by {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		ranks := by[id]
		slices.SortFunc(ranks, func(a, b cp.WorkerInfo) int { return a.Rank - b.Rank })
		if msg := checkGroup(ranks, m); msg != "" {
			problems = append(problems, fmt.Sprintf("group %s: %s", id, msg))
			continue
		}
		g := group{ID: id, Ranks: ranks, Capacity: m.MaxPositions}
		free := m.MaxPositions
		for _, r := range ranks {
			g.Capacity = min(g.Capacity, m.MaxShardTokens(r.Layers.First, r.Layers.End, int64(r.MemoryTotal), r.TensorRanks))
			if r.MemoryTotal > 0 {
				free = min(free, r.MaxSeqTokens)
			}
			g.Active = max(g.Active, r.Active+r.QueueDepth)
		}
		g.Free = free
		usable = append(usable, g)
	}
	return usable, problems
}

// checkGroup says why a group cannot take jobs, or "".
func checkGroup(ranks []cp.WorkerInfo, m *modelinfo.Info) string {
	size := ranks[0].GroupSize
	var missing []string
	next := 0
	for _, r := range ranks {
		switch {
		case !modelinfo.Match(m.ID, r.Model):
			return fmt.Sprintf("rank %d (%s) serves model %q, the coordinator %q", r.Rank, r.ID, r.Model, m.ID)
		case r.Model != ranks[0].Model:
			// The ranks exchange activations computed from their tensors.
			return fmt.Sprintf("rank %d (%s) serves model %q, rank %d (%s) %q", r.Rank, r.ID, r.Model, ranks[0].Rank, ranks[0].ID, ranks[0].Model)
		case r.GroupSize != size:
			return fmt.Sprintf("ranks disagree on the group size (%d and %d)", size, r.GroupSize)
		case r.Draining:
			return fmt.Sprintf("rank %d (%s) takes no jobs (draining, or its ring is not formed)", r.Rank, r.ID)
		case r.Rank < next:
			return fmt.Sprintf("rank %d is registered twice", r.Rank)
		}
		for ; next < r.Rank; next++ {
			missing = append(missing, fmt.Sprint(next))
		}
		next = r.Rank + 1
	}
	for ; next < size; next++ {
		missing = append(missing, fmt.Sprint(next))
	}
	if len(missing) > 0 {
		return fmt.Sprintf("rank(s) %s of %d not registered", strings.Join(missing, ", "), size)
	}
	return checkStages(ranks, m)
}

// checkStages says why a group's ranks (registered, 0..size-1) do not make
// pipeline stages of tensor ranks that tile the model's layers, or "".
func checkStages(ranks []cp.WorkerInfo, m *modelinfo.Info) string {
	ps := make([]cp.LayerPlacement, len(ranks))
	for i, r := range ranks {
		ps[i] = cp.LayerPlacement{Rank: r.Rank, Layers: r.Layers, TensorRank: r.TensorRank, TensorRanks: r.TensorRanks}
	}
	if err := cp.CheckStages("decode group", ps); err != nil {
		return err.Error()
	}
	if end := ranks[len(ranks)-1].Layers.End; end != m.NumLayers {
		return fmt.Sprintf("the ranks hold layers [0,%d), the model has %d", end, m.NumLayers)
	}
	return ""
}

// prefillWorkers are the model's prefill workers taking jobs, least loaded
// first.
func prefillWorkers(workers map[string]cp.WorkerInfo, m *modelinfo.Info) []cp.WorkerInfo {
	var out []cp.WorkerInfo
	for _, w := range workers {
		if w.Kind == cp.KindPrefill && modelinfo.Match(m.ID, w.Model) && !w.Draining {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b cp.WorkerInfo) int {
		if d := (a.Active + a.QueueDepth) - (b.Active + b.QueueDepth); d != 0 {
			return d
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// lossWatch tells requests in flight to a worker that the registry lost it:
// a run waiting for a worker's answer reads no inbox, and a worker that
// died holding the request would otherwise keep it waiting for the whole
// request timeout.
type lossWatch struct {
	mu   sync.Mutex
	next int
	on   map[string]map[int]func(reason string, since time.Time)
}

// watch calls lost (from the registry watch; it must not block) at each
// loss of worker id until the returned stop is called.
func (l *lossWatch) watch(id string, lost func(reason string, since time.Time)) (stop func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.on == nil {
		l.on = map[string]map[int]func(string, time.Time){}
	}
	if l.on[id] == nil {
		l.on[id] = map[int]func(string, time.Time){}
	}
	k := l.next
	l.next++
	l.on[id][k] = lost
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.on[id], k)
		if len(l.on[id]) == 0 {
			delete(l.on, id)
		}
	}
}

func (l *lossWatch) notify(id, reason string, since time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.on[id] {
		f(reason, since)
	}
}

// availability answers a client's availability request from the registry
// as this coordinator follows it.
func (c *Coordinator) availability(ctx context.Context, _ *cp.AvailabilityRequest) (*cp.AvailabilityReply, error) {
	if _, err := cp.ClientOf(cp.RequestSubject(ctx)); err != nil {
		return nil, refuse(cp.CodeBadRequest, "%v", err)
	}
	workers, _ := c.view.snapshot()
	return availabilityOf(workers, c.cfg.Model), nil
}

// availabilityOf is what workers can run of model m: its usable decode
// groups (as placement sees them), their longest sequence, its prefill
// workers, and why the other groups are not usable.
func availabilityOf(workers map[string]cp.WorkerInfo, m *modelinfo.Info) *cp.AvailabilityReply {
	gs, problems := groups(workers, m)
	rep := &cp.AvailabilityReply{Model: m.ID, DecodeGroups: len(gs), PrefillWorkers: len(prefillWorkers(workers, m))}
	for _, g := range gs {
		rep.DecodeRanks += len(g.Ranks)
		rep.MaxTokens = max(rep.MaxTokens, g.Capacity)
	}
	if len(problems) > maxReportedProblems {
		problems = append(problems[:maxReportedProblems-1], fmt.Sprintf("and %d more", len(problems)-maxReportedProblems+1))
	}
	rep.Problems = problems
	return rep
}

// maxReportedProblems is what an availability reply may carry (the
// protocol's bound).
const maxReportedProblems = 64
