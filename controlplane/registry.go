package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// RegistryConfig configures the worker registry. Zero fields take defaults.
type RegistryConfig struct {
	Bucket string // default WorkersBucket
	// TTL is how long a worker stays registered after its last heartbeat;
	// default 10 s. Workers should beat at least every TTL/3.
	TTL      time.Duration
	Memory   bool // keep the bucket in memory instead of on disk
	Replicas int  // default 1
}

// Registry is the worker registry: a JetStream key-value bucket with one key
// per worker, holding its latest WorkerInfo. Every put (heartbeat) restarts
// the key's TTL; a worker that stops beating expires, and watchers see it go.
type Registry struct {
	nc  *nats.Conn
	kv  jetstream.KeyValue
	ttl time.Duration
}

// OpenRegistry creates the bucket, or updates it to cfg when it exists.
func OpenRegistry(ctx context.Context, nc *nats.Conn, cfg RegistryConfig) (*Registry, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = WorkersBucket
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.TTL < time.Second {
		// The server keeps expiry markers at least 1 s and rejects shorter.
		return nil, fmt.Errorf("worker registry: TTL %v is below the 1s minimum", cfg.TTL)
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	kv, err := openBucket(ctx, nc, cfg.Memory, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "tandem workers: key = worker id, value = WorkerInfo (msgpack)",
		History:     1,
		TTL:         cfg.TTL,
		// With limit markers the server writes a marker when a key
		// expires, so watchers learn of the expiry instead of silence.
		LimitMarkerTTL: cfg.TTL,
		Replicas:       cfg.Replicas,
		MaxValueSize:   64 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("worker registry: bucket %s: %w", cfg.Bucket, err)
	}
	return &Registry{nc: nc, kv: kv, ttl: cfg.TTL}, nil
}

// BindRegistry opens an existing registry bucket (default WorkersBucket)
// without configuring it, for readers that must not change what the
// coordinators set up (an HTTP front door watching for workers).
func BindRegistry(ctx context.Context, nc *nats.Conn, bucket string) (*Registry, error) {
	if bucket == "" {
		bucket = WorkersBucket
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("worker registry: %w", err)
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("worker registry: bucket %s: %w", bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("worker registry: bucket %s: %w", bucket, err)
	}
	return &Registry{nc: nc, kv: kv, ttl: st.TTL()}, nil
}

// JoinRegistry opens the registry bucket (default WorkersBucket) as a
// worker with a tandem identity does: as the coordinators configured it,
// never creating or changing it (the worker identity may not: the stream
// API subjects are the coordinator's). A bucket that is not there yet (no
// coordinator has started) is waited for until ctx ends; waiting is
// logged once, through waiting (nil: silent).
func JoinRegistry(ctx context.Context, nc *nats.Conn, bucket string, waiting func(error)) (*Registry, error) {
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		reg, err := BindRegistry(ctx, nc, bucket)
		if err == nil || !errors.Is(err, jetstream.ErrBucketNotFound) {
			return reg, err
		}
		if waiting != nil {
			waiting(err)
			waiting = nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("worker registry: waiting for a coordinator to create it: %w (%w)", ctx.Err(), err)
		case <-time.After(pause):
		}
	}
}

// WorkerRegistry opens the registry for a worker. One logged in with a
// tandem identity (identity true) joins the bucket the coordinators set up
// (JoinRegistry), logging on log that it waits when there is none yet; one
// on a server without tandem identities (open, or one user for
// everything) creates or updates the bucket to cfg as OpenRegistry does,
// so that its workers may start before any coordinator.
func WorkerRegistry(ctx context.Context, nc *nats.Conn, cfg RegistryConfig, identity bool, log *zap.Logger) (*Registry, error) {
	if !identity {
		return OpenRegistry(ctx, nc, cfg)
	}
	if log == nil {
		log = zap.NewNop()
	}
	return JoinRegistry(ctx, nc, cfg.Bucket, func(err error) {
		log.Info("waiting for a coordinator to create the worker registry", zap.Error(err))
	})
}

// TTL is how long a worker stays registered after its last heartbeat.
func (r *Registry) TTL() time.Duration { return r.ttl }

// Put records w (a heartbeat): it validates w and stores it under its id.
func (r *Registry) Put(ctx context.Context, w *WorkerInfo) error {
	if err := w.Validate(); err != nil {
		return fmt.Errorf("worker registry: put: %w", err)
	}
	data, err := Marshal(MsgPack, w)
	if err != nil {
		return err
	}
	if _, err := r.kv.Put(ctx, w.ID, data); err != nil {
		return fmt.Errorf("worker registry: put %s: %w", w.ID, err)
	}
	return nil
}

// Remove deregisters worker id at once (a clean shutdown); watchers see
// WorkerLeft.
func (r *Registry) Remove(ctx context.Context, id string) error {
	if err := CheckID(id); err != nil {
		return fmt.Errorf("worker registry: remove: %w", err)
	}
	// Without a connection the delete would wait for its acknowledgement
	// until ctx ends (a worker leaving after the coordinator's NATS went
	// away hung for its whole shutdown timeout): the registry forgets the
	// worker after its TTL anyway.
	if r.nc != nil && !r.nc.IsConnected() {
		return fmt.Errorf("worker registry: remove %s: %w (NATS %s; the registry forgets it after %v)", id, ErrNotConnected,
			strings.ToLower(r.nc.Status().String()), r.ttl)
	}
	if err := r.kv.Delete(ctx, id); err != nil {
		return fmt.Errorf("worker registry: remove %s: %w", id, err)
	}
	return nil
}

// ErrNotConnected is returned by Remove while the connection to NATS is
// down.
var ErrNotConnected = errors.New("not connected")

// ErrWorkerNotFound is returned by Get for a worker that is not registered
// (never was, left, or expired).
var ErrWorkerNotFound = errors.New("worker not registered")

// Get returns worker id's latest heartbeat.
func (r *Registry) Get(ctx context.Context, id string) (*WorkerInfo, error) {
	if err := CheckID(id); err != nil {
		return nil, fmt.Errorf("worker registry: get: %w", err)
	}
	e, err := r.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, fmt.Errorf("worker registry: %s: %w", id, ErrWorkerNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("worker registry: get %s: %w", id, err)
	}
	if r.stale(e.Created()) {
		return nil, fmt.Errorf("worker registry: %s: last heartbeat %v ago: %w", id, time.Since(e.Created()).Round(time.Millisecond), ErrWorkerNotFound)
	}
	return decodeWorker(e)
}

// stale covers the moment between a key's TTL running out and the server
// removing it: a worker silent for longer than TTL is not live.
func (r *Registry) stale(created time.Time) bool { return time.Since(created) > r.ttl }

// List returns the live workers, sorted by id. A value that does not decode
// is skipped and reported in the error, along with the workers that do.
func (r *Registry) List(ctx context.Context) ([]WorkerInfo, error) {
	lister, err := r.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("worker registry: list: %w", err)
	}
	defer func() { _ = lister.Stop() }()
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("worker registry: list: %w", err)
	}
	var out []WorkerInfo
	var errs []error
	for _, k := range keys {
		e, err := r.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // expired or left since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("worker registry: list: get %s: %w", k, err)
		}
		if r.stale(e.Created()) {
			continue
		}
		w, err := decodeWorker(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int { return strings.Compare(a.ID, b.ID) })
	return out, errors.Join(errs...)
}

func decodeWorker(e jetstream.KeyValueEntry) (*WorkerInfo, error) {
	var w WorkerInfo
	if err := Unmarshal(MsgPack, e.Value(), &w); err != nil {
		return nil, fmt.Errorf("worker registry: key %s (revision %d): %w", e.Key(), e.Revision(), err)
	}
	if w.ID != e.Key() {
		return nil, fmt.Errorf("worker registry: key %s holds worker %q: %w", e.Key(), w.ID, ErrInvalid)
	}
	return &w, nil
}

// WorkerOp is the kind of a registry change.
type WorkerOp string

const (
	WorkerUp      WorkerOp = "up"      // registered or heartbeat: Info is the latest
	WorkerLeft    WorkerOp = "left"    // deregistered itself (Remove)
	WorkerExpired WorkerOp = "expired" // no heartbeat for TTL
	WorkerSynced  WorkerOp = "synced"  // every worker registered at Watch time has been sent
	WorkerInvalid WorkerOp = "invalid" // a value that does not decode; Err says why
)

// WorkerChange is one change seen by Watch.
type WorkerChange struct {
	Op   WorkerOp
	ID   string      // empty for WorkerSynced
	Info *WorkerInfo // WorkerUp only
	Time time.Time   // when the server recorded the change
	Err  error       // WorkerInvalid only
}

// Watch streams registry changes until ctx ends, then closes the channel.
// It starts with a WorkerUp for each registered worker, then WorkerSynced,
// then live changes. A slow reader delays the stream, it does not lose
// changes.
func (r *Registry) Watch(ctx context.Context) (<-chan WorkerChange, error) {
	w, err := r.kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("worker registry: watch: %w", err)
	}
	out := make(chan WorkerChange, 64)
	go func() {
		defer close(out)
		defer stopWatch(r.nc, w)
		for {
			var e jetstream.KeyValueEntry
			var ok bool
			select {
			case <-ctx.Done():
				return
			case e, ok = <-w.Updates():
				if !ok {
					return
				}
			}
			c := WorkerChange{Op: WorkerSynced}
			if e != nil {
				c = toChange(e)
				if c.Op == "" {
					continue
				}
			}
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// stopWatch stops a key-value watcher. Stopping deletes its consumer with a
// JetStream API request, which, with the server out of reach, waits out the
// API's 5 s timeout: a coordinator took that long to exit after SIGTERM
// once its NATS server was gone. Disconnected, the watcher is stopped on a
// goroutine of its own, which ends when that request fails (at the latest
// when the connection closes); the server drops an idle ephemeral
// consumer by itself.
func stopWatch(nc *nats.Conn, w jetstream.KeyWatcher) {
	if nc.IsConnected() {
		_ = w.Stop()
		return
	}
	go func() { _ = w.Stop() }()
}

func toChange(e jetstream.KeyValueEntry) WorkerChange {
	c := WorkerChange{ID: e.Key(), Time: e.Created()}
	switch e.Operation() {
	case jetstream.KeyValuePut:
		w, err := decodeWorker(e)
		if err != nil {
			c.Op, c.Err = WorkerInvalid, err
			return c
		}
		c.Op, c.Info = WorkerUp, w
	case jetstream.KeyValueDelete:
		c.Op = WorkerLeft
	case jetstream.KeyValuePurge:
		// The server's expiry marker, or an operator's purge: either way
		// the worker is gone without having said so.
		c.Op = WorkerExpired
	}
	return c
}

// openBucket creates a key-value bucket, or updates it to c when it exists,
// on file storage or, for tests and the demo, in memory.
func openBucket(ctx context.Context, nc *nats.Conn, memory bool, c jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c.Storage = jetstream.FileStorage
	if memory {
		c.Storage = jetstream.MemoryStorage
	}
	var kv jetstream.KeyValue
	err = whileJetStreamSettles(ctx, func(ctx context.Context) (err error) {
		kv, err = js.CreateOrUpdateKeyValue(ctx, c)
		return err
	})
	return kv, err
}
