// Package service is the coordinator: it accepts jobs on the control
// plane (submit, cancel, list), stores them in the durable job queue,
// follows the worker registry, routes each job with the cost model
// (coordinator/router), assigns it to a decode group and, for a remote
// prefill, a prefill worker, follows its progress to a final state, and
// only then removes it from the queue.
//
// Several coordinators can share one NATS deployment: they serve the
// request subjects in one queue group and share the queue's durable
// consumer.
package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/coordinator/jobs"
	"github.com/tandem-inference/tandem/coordinator/metrics"
	"github.com/tandem-inference/tandem/coordinator/modelinfo"
	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/internal/bytebudget"
	"github.com/tandem-inference/tandem/tokenizer"
)

// Config configures a coordinator. Zero values take the defaults named.
type Config struct {
	// Model is the model the coordinator serves, from its config.json.
	Model *modelinfo.Info
	// Tokenizer encodes text prompts; nil accepts token ids only.
	Tokenizer *tokenizer.Tokenizer

	// Policy is the routing policy of jobs that do not name one; default
	// auto.
	Policy cp.Policy
	// Rates seed the cost model; measured job figures move them by an EWMA
	// with weight Alpha, default 0.2, and the workers' heartbeats replace
	// the compute terms and the pass floor with their own measurements. A
	// zero rate is taken from the heartbeats until a job measures it.
	Rates router.Rates
	Alpha float64
	// SeedPrefillTokPerS and SeedLocalTokPerS, when Rates has no compute
	// terms for a path, seed them from a tokens/s figure: equal rates per
	// term such that a prompt of SeedTokens, default 1,024, takes that long.
	SeedPrefillTokPerS, SeedLocalTokPerS float64
	SeedTokens                           int

	// MaxPromptTokens refuses longer prompts at submission; default the
	// model's longest sequence. DefaultMaxTokens is the output length of a
	// job that does not say, default 256, and MaxOutputTokens the most a job
	// may ask for, default 32768.
	MaxPromptTokens  int
	DefaultMaxTokens int
	// Images bound a submission's images (zero fields: images.DefaultLimits).
	Images          images.Limits
	MaxOutputTokens int

	Queue    cp.QueueConfig
	Registry cp.RegistryConfig
	// Results configures the store of finished jobs' final events, from
	// which a client that lost its connection learns how its job ended.
	Results cp.ResultsConfig

	// MaxRunning bounds the jobs this coordinator drives at once, default
	// 1024; the others wait in the queue.
	MaxRunning int
	// SubmitHandlers is the number of parallel handlers of small
	// submissions, default 4, since a submission waits for the queue's
	// store; large ones are handled one at a time.
	SubmitHandlers int
	// SubmitBytes bounds the bytes of large submissions, over 64 KiB, that
	// the coordinator holds at once, read and not yet answered; default 64
	// MiB and at least the largest message. One that does not fit is
	// answered unavailable at once, so that a burst of large prompts
	// neither exhausts memory nor keeps the coordinator from reading its
	// connection.
	SubmitBytes int64
	// Budget, when set, is the byte budget submissions are held to instead
	// of one of SubmitBytes: `coordinator serve` shares one between the
	// coordinator and its HTTP front door, so that request bodies and
	// submissions together stay within it.
	Budget *bytebudget.Budget
	// AssignTimeout bounds a worker's answer to an assignment or a
	// cancellation; default 10 s.
	AssignTimeout time.Duration
	// PlacementWait is how long a job waits for a decode group, and under
	// policy remote a prefill worker, with room for it before it fails;
	// default 60 s.
	PlacementWait time.Duration
	// StallTimeout fails a decoding job whose decode group reported
	// nothing for that long; default 2 min, while the group reports every
	// few seconds.
	StallTimeout time.Duration
	// TransferTimeout is a remote job's deadline for prefill and transfer,
	// given to both sides; default 30 min.
	TransferTimeout time.Duration
	// JobTimeout bounds a job from submission to its end; default 2 h.
	JobTimeout time.Duration
	// ShutdownGrace is how long a stopping coordinator lets its running
	// jobs finish before it cancels them and hands them back to the queue;
	// default 30 s.
	ShutdownGrace time.Duration
	// KeepFinished is how many finished jobs the job list remembers;
	// default 10,000.
	KeepFinished int

	Metrics *metrics.Metrics // nil: none
	Log     *zap.Logger
}

func (c *Config) withDefaults() (Config, error) {
	d := *c
	if d.Model == nil {
		return d, errors.New("coordinator: no model")
	}
	if d.Policy == "" {
		d.Policy = cp.PolicyAuto
	}
	if d.SeedTokens <= 0 {
		d.SeedTokens = 1024
	}
	if d.Rates.Prefill == (costmodel.Compute{}) && d.SeedPrefillTokPerS > 0 {
		d.Rates.Prefill = d.Model.Cost.Seed(d.SeedPrefillTokPerS, d.SeedTokens)
	}
	if d.Rates.Local == (costmodel.Compute{}) && d.SeedLocalTokPerS > 0 {
		d.Rates.Local = d.Model.Cost.Seed(d.SeedLocalTokPerS, d.SeedTokens)
	}
	switch {
	case d.MaxPromptTokens <= 0:
		d.MaxPromptTokens = d.Model.MaxPositions - 1
	case d.MaxPromptTokens >= d.Model.MaxPositions:
		return d, fmt.Errorf("coordinator: max prompt tokens %d: the model holds %d positions, prompt and output together", d.MaxPromptTokens, d.Model.MaxPositions)
	}
	d.Images = d.Images.OrDefault()
	if d.DefaultMaxTokens <= 0 {
		d.DefaultMaxTokens = 256
	}
	if d.MaxOutputTokens <= 0 {
		d.MaxOutputTokens = 32768
	}
	if d.DefaultMaxTokens > d.MaxOutputTokens {
		return d, fmt.Errorf("coordinator: default max tokens %d exceeds the maximum %d", d.DefaultMaxTokens, d.MaxOutputTokens)
	}
	defaults := []struct {
		p *time.Duration
		v time.Duration
	}{{&d.AssignTimeout, 10 * time.Second}, {&d.PlacementWait, time.Minute}, {&d.StallTimeout, 2 * time.Minute},
		{&d.TransferTimeout, 30 * time.Minute}, {&d.JobTimeout, 2 * time.Hour}, {&d.ShutdownGrace, 30 * time.Second}}
	for _, x := range defaults {
		if *x.p <= 0 {
			*x.p = x.v
		}
	}
	if d.MaxRunning <= 0 {
		d.MaxRunning = 1024
	}
	if d.SubmitHandlers <= 0 {
		d.SubmitHandlers = 4
	}
	if d.SubmitBytes <= 0 {
		d.SubmitBytes = 64 << 20
	}
	d.SubmitBytes = max(d.SubmitBytes, cp.MaxMessageSize)
	if d.Budget == nil {
		d.Budget = bytebudget.New(d.SubmitBytes)
	}
	d.SubmitBytes = d.Budget.Limit()
	if d.KeepFinished <= 0 {
		d.KeepFinished = 10000
	}
	if d.Log == nil {
		d.Log = zap.NewNop()
	}
	return d, nil
}

// Coordinator is a running coordinator.
type Coordinator struct {
	cfg Config
	nc  *nats.Conn
	log *zap.Logger
	// dropLog logs dropped client requests, at most a few a minute: a
	// client that floods them cannot fill the log (the metric counts all).
	dropLog *zap.Logger
	m       *metrics.Metrics
	table   *jobs.Table
	est     *router.Estimator
	view    *view
	load    *loadTracker

	queue   *cp.JobQueue
	reg     *cp.Registry
	results *cp.Results

	// losses tells assignments in flight that their worker was lost.
	losses lossWatch

	mu            sync.Mutex
	runs          map[string]*run
	pendingCancel map[string]string // queued jobs cancelled before delivery: id -> reason
	ready         chan struct{}     // closed once Run serves
}

// New makes a coordinator on nc; Run starts it.
func New(nc *nats.Conn, cfg Config) (*Coordinator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	dropLog := cfg.Log.WithOptions(zap.WrapCore(func(core zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(core, time.Minute, 5, 0)
	}))
	return &Coordinator{cfg: cfg, nc: nc, log: cfg.Log, dropLog: dropLog, m: cfg.Metrics, table: jobs.NewTable(cfg.KeepFinished),
		est: router.NewEstimator(cfg.Rates, cfg.Alpha), view: newView(), load: newLoadTracker(),
		runs: map[string]*run{}, pendingCancel: map[string]string{}, ready: make(chan struct{})}, nil
}

// Budget is the byte budget the coordinator holds submissions to, its
// Config.Budget or the one it made of SubmitBytes. An HTTP front door in
// the same process holds its request bodies to it too.
func (c *Coordinator) Budget() *bytebudget.Budget { return c.cfg.Budget }

// Ready is closed once the coordinator serves requests and takes jobs.
func (c *Coordinator) Ready() <-chan struct{} { return c.ready }

// Rates are the cost model's current rates.
func (c *Coordinator) Rates() router.Rates { return c.est.Rates() }

// Run serves until ctx ends, then shuts down cleanly: it stops taking
// submissions and jobs, hands the jobs not yet assigned back to the queue
// at once, lets running jobs finish for up to ShutdownGrace, then cancels
// the rest on their workers and hands them back too.
func (c *Coordinator) Run(ctx context.Context) error {
	setup, cancelSetup := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSetup()
	var err error
	if c.queue, err = cp.OpenJobQueue(setup, c.nc, c.cfg.Queue); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if c.reg, err = cp.OpenRegistry(setup, c.nc, c.cfg.Registry); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if c.results, err = cp.OpenResults(setup, c.nc, c.cfg.Results); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	// The job list starts with the jobs already in the queue (a restart
	// must not hide them until they are routed).
	if err := c.queue.Stored(setup, func(qj *cp.QueuedJob) {
		c.table.Own(qj.JobID, qj.Client, qj.WireEncoding())
		c.table.Record(jobs.New(qj.JobID, qj.Submitted, len(qj.Request.TokenIDs)).Queued("stored in the job queue"))
	}); err != nil {
		c.log.Warn("listing the queued jobs", zap.Error(err))
	}

	// Background work lives until every job has settled, after ctx ends.
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	var bgWG sync.WaitGroup
	defer bgWG.Wait()
	defer stopBG()

	changes, err := c.reg.Watch(bg)
	if err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	bgWG.Add(1)
	go func() { defer bgWG.Done(); c.watch(changes) }()
	select {
	case <-c.view.synced:
	case <-setup.Done():
		return fmt.Errorf("coordinator: the worker registry did not list its workers: %w", setup.Err())
	}

	// Reports published while the connection was down are lost: every
	// run asks its decode group how its job stands once it is back.
	prevReconnected := c.nc.Opts.ReconnectedCB
	c.nc.SetReconnectHandler(func(nc *nats.Conn) {
		if prevReconnected != nil {
			prevReconnected(nc)
		}
		c.mu.Lock()
		for _, r := range c.runs {
			r.inbox.put(message{reconnected: true})
		}
		c.mu.Unlock()
	})
	defer c.nc.SetReconnectHandler(prevReconnected)

	progress, err := c.nc.Subscribe(cp.SubjectAllProgress, c.onProgress)
	if err != nil {
		return fmt.Errorf("coordinator: subscribe to progress: %w", err)
	}
	defer func() { _ = progress.Unsubscribe() }()

	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	waitSubmits, err := c.serveSubmits(serveCtx)
	if err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	defer func() { stopServing(); waitSubmits() }()
	for range 2 {
		if _, err := cp.Subscribe(c.nc, cp.SubjectAllCancel, cp.QueueGroupCoordinators, serveCtx.Done(),
			c.fromClient(func(m *nats.Msg) { cp.Answer(serveCtx, m, c.cancelJob) })); err != nil {
			return fmt.Errorf("coordinator: %w", err)
		}
	}
	if _, err := cp.Subscribe(c.nc, cp.SubjectAllList, cp.QueueGroupCoordinators, serveCtx.Done(),
		c.fromClient(func(m *nats.Msg) { cp.Answer(serveCtx, m, c.list) })); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if _, err := cp.Subscribe(c.nc, cp.SubjectAllAvailability, cp.QueueGroupCoordinators, serveCtx.Done(),
		c.fromClient(func(m *nats.Msg) { cp.Answer(serveCtx, m, c.availability) })); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	bgWG.Add(1)
	go func() { defer bgWG.Done(); c.pollQueue(bg) }()

	c.log.Info("coordinator serving", zap.String("model", c.cfg.Model.ID), zap.String("policy", string(c.cfg.Policy)),
		zap.Int("layers", c.cfg.Model.NumLayers), zap.Bool("tokenizer", c.cfg.Tokenizer != nil))
	close(c.ready)

	var runs sync.WaitGroup
	c.consume(ctx, &runs)
	stopServing()
	c.log.Info("coordinator stopping: waiting for running jobs", zap.Int("running", c.running()),
		zap.Duration("grace", c.cfg.ShutdownGrace))
	runs.Wait()
	c.log.Info("coordinator stopped")
	return nil
}

// fromClient guards handle, the handler of a client request subject: a
// request is handled only when its reply subject is the asking client's own
// inbox (cp.CheckClientReply). Any other request is dropped before it is
// decoded, with a log line and the dropped_requests_total metric, and
// nothing is sent anywhere: the coordinator's permissions are not lent to
// a client that names another subject as its reply. A message without a
// reply subject goes to handle, which ignores it.
func (c *Coordinator) fromClient(handle nats.MsgHandler) nats.MsgHandler {
	return func(m *nats.Msg) {
		if m.Reply != "" {
			if err := cp.CheckClientReply(m.Subject, m.Reply); err != nil {
				// Logged before it is counted: once the count is in, so is
				// the line (tests settle on the count).
				c.dropLog.Warn("client request dropped unanswered: its reply subject is not the client's inbox",
					zap.String("subject", m.Subject), zap.String("reply", m.Reply), zap.Error(err))
				c.m.DroppedRequest(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
				return
			}
		}
		handle(m)
	}
}

// consume takes jobs from the queue until ctx ends, and drives each.
func (c *Coordinator) consume(ctx context.Context, runs *sync.WaitGroup) {
	slots := make(chan struct{}, c.cfg.MaxRunning)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		d, err := c.queue.Next(ctx)
		if err != nil {
			<-slots
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, cp.ErrInvalid) {
				c.log.Error("undecodable job in the queue, terminated", zap.Error(err))
				continue
			}
			c.log.Warn("job queue", zap.Error(err))
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
			continue
		}
		runs.Add(1)
		go func() {
			defer runs.Done()
			defer func() { <-slots }()
			c.drive(ctx, d)
		}()
	}
}

func (c *Coordinator) running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.runs)
}

// pollQueue keeps the queue-depth metrics current.
func (c *Coordinator) pollQueue(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.queue.Stats(qctx)
		cancel()
		if err == nil {
			c.m.Queue(st.Waiting, st.InFlight)
		}
		c.m.Running(c.running())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publish announces a job event to the client that owns the job and
// records it in the job list.
func (c *Coordinator) publish(ev cp.JobEvent) {
	c.table.Record(ev)
	owner, ok := c.table.Owner(ev.JobID)
	if !ok {
		// Every path that makes a job's events records its owner first.
		c.log.Error("job event of a job without a client", zap.String("job", ev.JobID), zap.String("state", string(ev.State)))
		return
	}
	if err := cp.PublishAs(c.nc, cp.ClientJobEvents(owner, ev.JobID), c.table.Encoding(ev.JobID), &ev); err != nil {
		c.log.Warn("publish job event", zap.String("job", ev.JobID), zap.String("state", string(ev.State)), zap.Error(err))
	}
}
