package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/kvtransfer"
)

// Client talks to one rank's front door.
type Client struct {
	ch *kvtransfer.Channel

	mu      sync.Mutex
	streams map[string]*Stream
	stats   chan *reply // the one outstanding Stats call's answer
	statsMu sync.Mutex  // one Stats call at a time
	err     error       // why the connection ended
	done    chan struct{}
}

// Dial connects to the rank at addr of group, retrying while the rank is
// not accepting yet (starting, or busy accepting another client) until ctx
// ends.
func Dial(ctx context.Context, addr, group string, secret []byte, to kvtransfer.Timeouts) (*Client, error) {
	var last error
	for {
		ch, err := kvtransfer.DialChannel(ctx, kvtransfer.ChannelConfig{Addr: addr, ID: ChannelID(group), Secret: secret, Timeouts: to})
		if err == nil {
			c := &Client{ch: ch, streams: map[string]*Stream{}, stats: make(chan *reply, 1), done: make(chan struct{})}
			go c.readLoop()
			return c, nil
		}
		if errors.Is(err, kvtransfer.ErrAuth) {
			return nil, err
		}
		last = err
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return nil, errorf("dial %s: %w (last error: %v)", addr, ctx.Err(), last)
		}
	}
}

// Stream is a submitted sequence's tokens and end.
type Stream struct {
	id       string
	mu       sync.Mutex
	tokens   []int32
	res      Result
	admitted chan error    // the admission's answer
	more     chan struct{} // closed (and replaced) at each token
	end      chan struct{}
	ended    bool
}

// Tokens returns the tokens received so far.
func (s *Stream) Tokens() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tokens)
}

// Wait waits for the end and returns every token and the result.
func (s *Stream) Wait(ctx context.Context) ([]int32, Result, error) {
	select {
	case <-s.end:
	case <-ctx.Done():
		return s.Tokens(), Result{}, fmt.Errorf("sequence %q: %w", s.id, ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tokens), s.res, nil
}

// WaitTokens waits until the stream holds at least n tokens and returns
// them; it fails if the sequence ends with fewer, or when ctx is done.
func (s *Stream) WaitTokens(ctx context.Context, n int) ([]int32, error) {
	for {
		s.mu.Lock()
		got, more, ended, res := len(s.tokens), s.more, s.ended, s.res
		if got >= n || ended {
			toks := slices.Clone(s.tokens)
			s.mu.Unlock()
			if got >= n {
				return toks, nil
			}
			return toks, fmt.Errorf("sequence %q ended (%s %s) after %d tokens, before %d", s.id, res.Reason, res.Err, got, n)
		}
		s.mu.Unlock()
		select {
		case <-more:
		case <-s.end:
		case <-ctx.Done():
			return s.Tokens(), fmt.Errorf("sequence %q: %d of %d tokens: %w", s.id, got, n, ctx.Err())
		}
	}
}

// Done is closed when the sequence has ended.
func (s *Stream) Done() <-chan struct{} { return s.end }

func (s *Stream) finish(r Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.ended = true
		s.res = r
		close(s.end)
	}
}

// Submit submits a sequence to rank 0 and waits for its admission; a refusal
// is returned as a *RefusedError.
func (c *Client) Submit(ctx context.Context, r Request) (*Stream, error) {
	s := &Stream{id: r.ID, admitted: make(chan error, 1), more: make(chan struct{}), end: make(chan struct{})}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	if c.streams[r.ID] != nil {
		c.mu.Unlock()
		return nil, errorf("sequence %q is already submitted on this client", r.ID)
	}
	c.streams[r.ID] = s
	c.mu.Unlock()
	if err := c.ch.Send(ctx, &request{Op: opSubmit, Seq: r.ID, Submit: r.body()}, nil); err != nil {
		return nil, errorf("submit %q: %w", r.ID, err)
	}
	select {
	case err := <-s.admitted:
		if err != nil {
			return nil, err
		}
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		return nil, c.cause()
	}
}

// Cancel asks rank 0 to cancel a sequence; its stream then ends.
func (c *Client) Cancel(ctx context.Context, id string) error {
	return c.ch.Send(ctx, &request{Op: opCancel, Seq: id}, nil)
}

// Stats returns the rank's stats.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	c.statsMu.Lock()
	defer c.statsMu.Unlock()
	if err := c.ch.Send(ctx, &request{Op: opStats}, nil); err != nil {
		return Stats{}, err
	}
	select {
	case r := <-c.stats:
		return Stats{Stats: *r.Stats, Goroutines: r.Goroutines}, nil
	case <-ctx.Done():
		return Stats{}, ctx.Err()
	case <-c.done:
		return Stats{}, c.cause()
	}
}

// Close disconnects; the rank cancels the sequences still running.
func (c *Client) Close() error {
	err := c.ch.Close()
	<-c.done
	return err
}

func (c *Client) cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Client) readLoop() {
	defer close(c.done)
	var err error
	for {
		var r reply
		if _, err = c.ch.Recv(context.Background(), &r, nil); err != nil {
			break
		}
		if r.Op == opStats {
			if r.Stats != nil {
				select {
				case c.stats <- &r:
				default:
				}
			}
			continue
		}
		c.mu.Lock()
		s := c.streams[r.Seq]
		c.mu.Unlock()
		if s == nil {
			continue
		}
		switch r.Op {
		case opAdmitted:
			s.admitted <- nil
		case opRefused:
			c.forget(r.Seq)
			if r.Rank >= 0 {
				s.admitted <- &RefusedError{Seq: r.Seq, Rank: r.Rank, Reason: r.Err}
			} else {
				s.admitted <- errorf("sequence %q: %s", r.Seq, r.Err)
			}
		case opToken:
			s.mu.Lock()
			if r.Index == len(s.tokens) {
				s.tokens = append(s.tokens, r.Token)
				close(s.more)
				s.more = make(chan struct{})
			}
			s.mu.Unlock()
		case opEnd:
			c.forget(r.Seq)
			select { // it may end before its admission's answer arrives
			case s.admitted <- nil:
			default:
			}
			s.finish(Result{Reason: pipeline.Reason(r.Reason), Err: r.Err, Tokens: r.Tokens})
		}
	}
	c.mu.Lock()
	c.err = errorf("connection closed: %w", err)
	streams := c.streams
	c.streams = map[string]*Stream{}
	c.mu.Unlock()
	for _, s := range streams {
		select {
		case s.admitted <- c.err:
		default:
		}
		s.finish(Result{Reason: pipeline.ReasonError, Err: c.err.Error()})
	}
}

func (c *Client) forget(id string) {
	c.mu.Lock()
	delete(c.streams, id)
	c.mu.Unlock()
}
