package controlplane

// The worker side of the registry: what a worker of any kind needs to take
// part in the control plane, a heartbeat that keeps its WorkerInfo in the
// registry and an id that fits the protocol. The prefill and decode
// workers' control-plane adapters use it.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Heartbeat keeps a worker registered: it puts the worker's current
// WorkerInfo into the registry every interval until Stop.
type Heartbeat struct {
	reg   *Registry
	id    string
	every time.Duration
	info  func() WorkerInfo
	log   *zap.Logger

	cancel context.CancelFunc
	done   chan struct{}
	kick   chan struct{}
	once   sync.Once
}

// StartHeartbeat registers the worker at once (an error here is returned:
// a worker that cannot register should not start) and then beats every
// interval; 0 means a third of the registry's TTL, the protocol's slowest.
// info is called for each beat and must be safe to call from another
// goroutine.
func StartHeartbeat(ctx context.Context, reg *Registry, every time.Duration, info func() WorkerInfo, log *zap.Logger) (*Heartbeat, error) {
	if every <= 0 {
		every = reg.TTL() / 3
	}
	if every > reg.TTL()/3 {
		return nil, fmt.Errorf("heartbeat every %v: the registry forgets a worker after %v, beat at least every %v", every, reg.TTL(), reg.TTL()/3)
	}
	if log == nil {
		log = zap.NewNop()
	}
	first := info()
	putCtx, cancelPut := context.WithTimeout(ctx, every)
	err := reg.Put(putCtx, &first)
	cancelPut()
	if err != nil {
		return nil, fmt.Errorf("register worker %s: %w", first.ID, err)
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	h := &Heartbeat{reg: reg, id: first.ID, every: every, info: info, log: log, cancel: cancel,
		done: make(chan struct{}), kick: make(chan struct{}, 1)}
	go h.loop(loopCtx)
	return h, nil
}

// Beat sends a heartbeat soon, outside the schedule (after a change the
// coordinator should see quickly, e.g. the decode ring forming).
func (h *Heartbeat) Beat() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *Heartbeat) loop(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.kick:
		}
		w := h.info()
		putCtx, cancel := context.WithTimeout(ctx, h.every)
		err := h.reg.Put(putCtx, &w)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			// Logged once per outage: the next beat retries.
			h.log.Warn("heartbeat failed; retrying every beat", zap.String("worker", h.id), zap.Error(err))
			failing = true
		case err == nil && failing:
			h.log.Info("heartbeat restored", zap.String("worker", h.id))
			failing = false
		}
	}
}

// Stop stops beating and deregisters the worker, so that the coordinator
// learns at once that it left (rather than after the TTL).
func (h *Heartbeat) Stop(ctx context.Context) error {
	var err error
	h.once.Do(func() {
		h.cancel()
		<-h.done
		if e := h.reg.Remove(ctx, h.id); e != nil {
			err = fmt.Errorf("deregister worker %s: %w", h.id, e)
		}
	})
	return err
}

// WorkerIDFrom turns a free-form name (a host name, a group name) into a valid
// worker id: characters outside [A-Za-z0-9_-] become '-', and it is cut to
// the protocol's length limit.
func WorkerIDFrom(parts ...string) (string, error) {
	s := strings.Join(parts, "-")
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	s = strings.Trim(string(b), "-")
	if len(s) > MaxIDLen {
		s = s[:MaxIDLen]
	}
	if err := CheckID(s); err != nil {
		return "", errors.Join(fmt.Errorf("worker id from %q", parts), err)
	}
	return s, nil
}
