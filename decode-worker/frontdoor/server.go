package frontdoor

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/decode-worker/sampling"
	"github.com/tandem-inference/tandem/kvtransfer"
)

// maxQueued bounds the replies queued for a slow client; past it the client
// is disconnected (and its sequences cancelled) rather than slowing the group.
const maxQueued = 1 << 16

// Serve accepts clients on srv until ctx ends, each on its own goroutines,
// and returns when they have all finished.
func Serve(ctx context.Context, srv *kvtransfer.Server, group string, secret []byte, w *pipeline.Worker, log *zap.Logger) {
	if log == nil {
		log = zap.NewNop()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		ch, err := srv.AcceptChannel(ctx, ChannelID(group), secret)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("frontdoor: accept failed", zap.Error(err))
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		c := &conn{ch: ch, w: w, log: log.With(zap.String("client", ch.RemoteAddr())), live: map[string]bool{}, wake: make(chan struct{}, 1)}
		c.ctx, c.cancel = context.WithCancel(ctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.serve()
		}()
	}
}

// conn is one client.
type conn struct {
	ch     *kvtransfer.Channel
	w      *pipeline.Worker
	log    *zap.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	queue  []*reply
	wake   chan struct{}
	live   map[string]bool // sequences this client submitted and not yet ended
	broken bool
}

func (c *conn) serve() {
	c.log.Info("frontdoor: client connected")
	c.wg.Add(1)
	go c.writeLoop()
	for {
		var req request
		if _, err := c.ch.Recv(c.ctx, &req, nil); err != nil {
			if c.ctx.Err() == nil {
				c.log.Info("frontdoor: client gone", zap.Error(err))
			}
			break
		}
		c.handle(&req)
	}
	c.cancel()
	c.ch.Close()
	c.wg.Wait()
	// Nobody is left to receive the tokens of this client's sequences.
	c.mu.Lock()
	var live []string
	for id := range c.live {
		live = append(live, id)
	}
	c.mu.Unlock()
	for _, id := range live {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = c.w.Cancel(ctx, id)
		cancel()
	}
}

func (c *conn) handle(req *request) {
	switch req.Op {
	case opSubmit:
		if req.Submit == nil {
			c.push(&reply{Op: opRefused, Seq: req.Seq, Err: "submit without a body", Rank: -1})
			return
		}
		c.mu.Lock()
		c.live[req.Seq] = true
		c.mu.Unlock()
		c.wg.Add(1)
		go func() { // admission waits on the ring; keep reading meanwhile
			defer c.wg.Done()
			c.submit(req.Seq, req.Submit)
		}()
	case opCancel:
		if err := c.w.Cancel(c.ctx, req.Seq); err != nil {
			c.push(&reply{Op: opError, Seq: req.Seq, Err: err.Error()})
		}
	case opStats:
		st := c.w.Stats()
		c.push(&reply{Op: opStats, Stats: &st, Goroutines: runtime.NumGoroutine()})
	default:
		c.push(&reply{Op: opError, Seq: req.Seq, Err: "unknown operation " + req.Op})
	}
}

func (c *conn) submit(id string, b *submitBody) {
	req := pipeline.Request{ID: id, Tokens: b.Tokens, MaxTokens: b.MaxTokens, Stop: b.Stop, Sink: c,
		Sampling: sampling.Params{Temperature: b.Temperature, TopK: b.TopK, TopP: b.TopP, Seed: b.Seed}}
	if rm := b.Remote; rm != nil {
		req.Remote = &pipeline.Remote{Tokens: rm.Tokens, Deadline: time.Unix(0, rm.Deadline)}
		for _, s := range rm.Sessions {
			req.Remote.Sessions = append(req.Remote.Sessions, pipeline.Session{ID: s.ID, Secret: s.Secret})
		}
	}
	err := c.w.Submit(c.ctx, req)
	if err == nil {
		c.push(&reply{Op: opAdmitted, Seq: id})
		return
	}
	c.mu.Lock()
	delete(c.live, id)
	c.mu.Unlock()
	r := &reply{Op: opRefused, Seq: id, Err: err.Error(), Rank: -1}
	var re *pipeline.RefusedError
	if errors.As(err, &re) {
		r.Rank, r.Err = re.Rank, re.Reason
	}
	c.push(r)
}

// Token and End make conn the sink of its sequences.
func (c *conn) Token(seq string, index int, token int32) {
	c.push(&reply{Op: opToken, Seq: seq, Index: index, Token: token})
}

func (c *conn) End(seq string, r pipeline.Result) {
	c.mu.Lock()
	delete(c.live, seq)
	c.mu.Unlock()
	m := &reply{Op: opEnd, Seq: seq, Reason: string(r.Reason), Tokens: r.Tokens}
	if r.Err != nil {
		m.Err = r.Err.Error()
	}
	c.push(m)
}

// push queues a reply without blocking; a client that falls too far behind
// is disconnected.
func (c *conn) push(r *reply) {
	c.mu.Lock()
	if c.broken {
		c.mu.Unlock()
		return
	}
	if len(c.queue) >= maxQueued {
		c.broken = true
		c.mu.Unlock()
		c.log.Warn("frontdoor: client too slow, disconnecting", zap.Int("queued", maxQueued))
		c.cancel()
		return
	}
	c.queue = append(c.queue, r)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) writeLoop() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		q := c.queue
		c.queue = nil
		c.mu.Unlock()
		for _, r := range q {
			if err := c.ch.Send(c.ctx, r, nil); err != nil {
				c.cancel()
				return
			}
		}
		select {
		case <-c.wake:
		case <-c.ctx.Done():
			return
		}
	}
}
