package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/images"
	"github.com/tandem-inference/tandem/coordinator/jobs"
	"github.com/tandem-inference/tandem/grammar"
	"github.com/tandem-inference/tandem/internal/progress"
	"github.com/tandem-inference/tandem/tokenizer"
)

// smallSubmit is the size up to which a submission is not held to the
// byte budget: ordinary prompts are answered even while large ones fill it.
const smallSubmit = 64 << 10

// maxHeldSubmits bounds the submissions read and not yet answered.
const maxHeldSubmits = 4096

// submitLoad is what the coordinator holds of submissions read and not yet
// answered.
type submitLoad struct {
	Bytes int64
	Count int
}

// admitSubmission decides from a submission's size alone, before it is
// decoded, whether the coordinator takes it on now (nil) or answers it at
// once with a refusal: held is what it holds already, budget the bytes of
// large submissions it may hold.
func admitSubmission(held submitLoad, size, budget int64) error {
	switch {
	case held.Count >= maxHeldSubmits:
		return refuse(cp.CodeUnavailable, "the coordinator holds %d submissions not yet answered; retry later", held.Count)
	case size <= smallSubmit:
		return nil
	case size > budget:
		return refuse(cp.CodeTooLarge, "the submission is %s, more than the %s this coordinator reads at once (submit_bytes)",
			progress.HumanBytes(size), progress.HumanBytes(budget))
	case held.Bytes+size > budget:
		return refuse(cp.CodeUnavailable, "the coordinator is reading %s of submissions, at most %s at once (submit_bytes); retry later",
			progress.HumanBytes(held.Bytes), progress.HumanBytes(budget))
	}
	return nil
}

// serveSubmits answers submissions until ctx ends. The subscriptions'
// callback only weighs each one (admitSubmission) and hands it to a handler
// or refuses it, so that the connections are read as fast as clients
// write: a burst of large prompts that a slow reader let pile up in the
// server would have the server drop the connection. Small and large
// submissions have their own handlers (SubmitHandlers, and one for large
// ones), so large ones never delay small ones. The returned function waits
// for the handlers and closes the connections.
func (c *Coordinator) serveSubmits(ctx context.Context) (wait func(), err error) {
	var (
		mu    sync.Mutex
		held  submitLoad
		wg    sync.WaitGroup
		small = make(chan struct{}, c.cfg.SubmitHandlers)
		// Large ones decode (and tokenize) for long: one at a time keeps
		// the CPU for reading the connections and for the small ones.
		large = make(chan struct{}, 1)
	)
	intake := func(m *nats.Msg) {
		if m.Reply == "" {
			return // a publish, not a request: nobody to answer
		}
		size := int64(len(m.Data))
		budget := c.cfg.Budget
		mu.Lock()
		err := admitSubmission(submitLoad{Bytes: budget.Held(), Count: held.Count}, size, budget.Limit())
		switch {
		case err != nil:
		case size <= smallSubmit:
			budget.Take(size)
		case !budget.TryTake(size):
			// The HTTP front door took the room in between.
			err = refuse(cp.CodeUnavailable, "the coordinator is reading %s of submissions and request bodies, at most %s at once (submit_bytes); retry later",
				progress.HumanBytes(budget.Held()), progress.HumanBytes(budget.Limit()))
		}
		if err == nil {
			held.Count++
		}
		mu.Unlock()
		if err != nil {
			c.m.Submission(string(codeOf(err)))
			if rerr := cp.Refuse(m, &cp.SubmitReply{}, codeOf(err), err.Error()); rerr != nil {
				c.log.Warn("refuse submission", zap.Error(rerr))
			}
			return
		}
		lane := large
		if size <= smallSubmit {
			lane = small
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				budget.Release(size)
				mu.Lock()
				held.Count--
				mu.Unlock()
			}()
			select {
			case lane <- struct{}{}:
			case <-ctx.Done():
				_ = cp.Refuse(m, &cp.SubmitReply{}, cp.CodeUnavailable, "the coordinator is stopping; retry")
				return
			}
			defer func() { <-lane }()
			cp.Answer(ctx, m, c.submit)
		}()
	}

	// Submissions arrive on connections of their own: the server queues a
	// burst of large prompts for them, and the replies the coordinator
	// waits for on its main connection (the queue's store, the registry)
	// must not wait behind them. Several connections, each read by its own
	// goroutine, share a burst (the server spreads a queue group's
	// messages over them), so that a small submission waits behind a
	// fraction of it.
	var conns []*nats.Conn
	closeAll := func() {
		for _, nc := range conns {
			nc.Close()
		}
	}
	opts := c.nc.Opts
	opts.Name += " (submissions)"
	for range submitConns {
		snc, err := opts.Connect()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("connect for submissions: %w", err)
		}
		conns = append(conns, snc)
		if _, err := cp.Subscribe(snc, cp.SubjectAllSubmit, cp.QueueGroupCoordinators, ctx.Done(), c.fromClient(intake)); err != nil {
			closeAll()
			return nil, err
		}
	}
	return func() { wg.Wait(); closeAll() }, nil
}

// submitConns is the number of connections submissions arrive on.
const submitConns = 4

// submit accepts a job: it tokenizes the prompt, applies admission
// control, announces the job as queued and stores it in the job queue.
func (c *Coordinator) submit(ctx context.Context, req *cp.SubmitRequest) (*cp.SubmitReply, error) {
	received := time.Now() // tokenization is part of the time to first token
	client, err := cp.ClientOf(cp.RequestSubject(ctx))
	if err != nil {
		return nil, refuse(cp.CodeBadRequest, "%v", err)
	}
	id := cp.JobIDFor(client, req)
	if req.IdempotencyKey != "" {
		if _, ok := c.table.Get(id); ok {
			c.m.Submission("duplicate")
			return &cp.SubmitReply{JobID: id, Duplicate: true}, nil
		}
	}
	stored, err := c.admit(req)
	if err != nil {
		c.m.Submission(string(codeOf(err)))
		return nil, err
	}
	job := jobs.New(id, received, len(stored.TokenIDs))
	// The job's events and tokens go to the client in its submission's
	// encoding: a JSON submitter (the nats CLI) reads them as JSON.
	enc := cp.RequestEncoding(ctx)
	c.table.Own(id, client, enc)
	ev := job.Queued(fmt.Sprintf("%d prompt tokens, up to %d new", len(stored.TokenIDs), stored.MaxTokens))
	// Announced before it is stored, so that no later event of the job can
	// overtake it.
	c.publish(ev)
	enq, err := c.queue.Enqueue(ctx, &cp.QueuedJob{JobID: id, Submitted: received, Request: *stored, Client: client, Encoding: enc.Field()})
	if err != nil {
		var re *cp.RemoteError
		if !errors.As(err, &re) {
			// The queue did not answer (e.g. its stream is electing a
			// leader after a server died): nothing was stored, and the
			// same submission may be retried.
			err = &cp.RemoteError{Code: cp.CodeUnavailable, Message: "the job queue did not store the job, retry: " + err.Error()}
		}
		c.log.Warn("job not queued", zap.String("job", id), zap.Error(err))
		// Subscribers saw it queued: tell them it is not. The job list
		// forgets it, so that a retry with the same key is not taken for a
		// duplicate.
		if fe, ferr := job.Advance(cp.StateFailed, time.Now(), jobs.Update{
			Err: &cp.JobError{Code: codeOf(err), Message: "not queued: " + err.Error()}}); ferr == nil {
			_ = cp.PublishAs(c.nc, cp.ClientJobEvents(client, id), enc, &fe)
		}
		c.table.Forget(id)
		c.m.Submission(string(codeOf(err)))
		return nil, err
	}
	if enq.Duplicate {
		c.m.Submission("duplicate")
		return &cp.SubmitReply{JobID: id, Duplicate: true}, nil
	}
	c.m.Submission("accepted")
	c.log.Debug("job queued", zap.String("job", id), zap.Int("tokens", len(stored.TokenIDs)))
	return &cp.SubmitReply{JobID: id}, nil
}

func codeOf(err error) cp.ErrorCode {
	var re *cp.RemoteError
	if errors.As(err, &re) && re.Code != "" {
		return re.Code
	}
	if errors.Is(err, cp.ErrInvalid) {
		return cp.CodeBadRequest
	}
	return cp.CodeInternal
}

// refusal is an error answered with its code; its text is the message
// alone (the reply carries the code in its own field).
type refusal struct{ re *cp.RemoteError }

func (r *refusal) Error() string { return r.re.Message }
func (r *refusal) Unwrap() error { return r.re }

func refuse(code cp.ErrorCode, format string, args ...any) error {
	return &refusal{&cp.RemoteError{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// admit checks a valid request against the model and the limits, and
// returns the request as stored: the prompt as token ids, max_tokens set,
// and for a chat prompt the end-of-turn token among the stops.
func (c *Coordinator) admit(req *cp.SubmitRequest) (*cp.SubmitRequest, error) {
	m, tok := c.cfg.Model, c.cfg.Tokenizer
	out := *req
	var chat *tokenizer.Chat
	out.Prompt, out.Messages, out.Tools = "", nil, ""
	out.ReasoningEffort, out.ToolChoice, out.ResponseFormat, out.ThinkingBudget = "", "", "", 0
	imgs, err := c.admitImages(req)
	if err != nil {
		return nil, err
	}
	switch {
	case req.Prompt != "" || len(req.Messages) > 0:
		if tok == nil {
			return nil, refuse(cp.CodeBadRequest, "model %s has no tokenizer: submit token_ids instead of text", m.ID)
		}
		var ids []int
		if req.Prompt != "" {
			ids = tok.Encode(req.Prompt)
		} else {
			var err error
			if chat, err = ChatOf(req); err != nil {
				return nil, refuse(cp.CodeBadRequest, "%v", err)
			}
			chat.Images = imgs
			if ids, err = tok.EncodeChat(chat); err != nil {
				return nil, refuse(cp.CodeBadRequest, "messages: %v", err)
			}
			reply, err := chat.Reply()
			if err != nil {
				return nil, refuse(cp.CodeBadRequest, "%v", err)
			}
			out.Reply = &cp.ChatReply{Thinking: reply.Thinking, Tools: reply.Tools}
			// A chat turn ends with <|end_of_msg|>: stop there.
			if eom := tok.EndOfMessageID(); eom >= 0 && !slices.Contains(out.Stop.TokenIDs, int32(eom)) {
				out.Stop.TokenIDs = append(slices.Clone(out.Stop.TokenIDs), int32(eom))
			}
		}
		out.TokenIDs = make([]int32, len(ids))
		for i, id := range ids {
			out.TokenIDs[i] = int32(id)
		}
	default:
		out.TokenIDs = slices.Clone(req.TokenIDs)
		if len(imgs) > 0 {
			pad, _ := tok.SpecialID(tokenizer.MediaPad) // admitImages checked it
			if err := images.CheckPadRuns(out.TokenIDs, int32(pad), imgs); err != nil {
				return nil, refuse(cp.CodeBadRequest, "%v", err)
			}
		}
	}
	n := len(out.TokenIDs)
	if n == 0 {
		return nil, refuse(cp.CodeBadRequest, "empty prompt: the text encodes to no tokens")
	}
	for i, id := range out.TokenIDs {
		if int(id) >= m.VocabSize {
			return nil, refuse(cp.CodeBadRequest, "token_ids[%d] is %d, outside the model's vocabulary [0, %d)", i, id, m.VocabSize)
		}
	}
	for i, id := range out.Stop.TokenIDs {
		if int(id) >= m.VocabSize {
			return nil, refuse(cp.CodeBadRequest, "stop token #%d is %d, outside the model's vocabulary [0, %d)", i, id, m.VocabSize)
		}
	}
	if len(out.Stop.TokenIDs)+len(out.Stop.Texts) > cp.MaxStops {
		return nil, refuse(cp.CodeBadRequest, "stop has %d entries with the end-of-turn token, at most %d allowed", len(out.Stop.TokenIDs)+len(out.Stop.Texts), cp.MaxStops)
	}
	if len(out.Stop.Texts) > 0 && tok == nil {
		return nil, refuse(cp.CodeBadRequest, "model %s has no tokenizer: stop texts cannot be matched; give stop token ids", m.ID)
	}
	if n > c.cfg.MaxPromptTokens {
		return nil, refuse(cp.CodeTooLarge, "prompt has %d tokens, at most %d allowed (limits.max_prompt_tokens)", n, c.cfg.MaxPromptTokens)
	}
	if out.MaxTokens == 0 {
		out.MaxTokens = min(c.cfg.DefaultMaxTokens, m.MaxPositions-n)
	}
	if out.MaxTokens > c.cfg.MaxOutputTokens {
		return nil, refuse(cp.CodeTooLarge, "max_tokens is %d, at most %d allowed (limits.max_output_tokens)", out.MaxTokens, c.cfg.MaxOutputTokens)
	}
	if n+out.MaxTokens > m.MaxPositions {
		return nil, refuse(cp.CodeTooLarge, "prompt (%d tokens) and max_tokens (%d) exceed the model's %d positions", n, out.MaxTokens, m.MaxPositions)
	}
	if chat != nil && req.Grammar != nil {
		return nil, refuse(cp.CodeBadRequest, "sampling.grammar: a chat's reply is constrained by its tool_choice and response_format, not by a grammar of its own")
	}
	if chat != nil {
		g, err := chat.Constraint(thinkingBudget(req.ThinkingBudget, out.MaxTokens))
		if err != nil {
			return nil, refuse(cp.CodeBadRequest, "%v", err)
		}
		out.Grammar = g
	}
	if out.Grammar != nil {
		// The decode group compiles it again (cached there); here a
		// schema it cannot hold is the client's error, not a failed job.
		if _, err := grammar.Compile(out.Grammar); err != nil {
			return nil, refuse(cp.CodeBadRequest, "%v", err)
		}
	}
	// What the decode groups can hold at all (their memory budgets); one
	// that is busy now may take the job later.
	workers, _ := c.view.snapshot()
	if gs, _ := groups(workers, m); len(gs) > 0 {
		best := gs[0]
		for _, g := range gs[1:] {
			if g.Capacity > best.Capacity {
				best = g
			}
		}
		if need := n + out.MaxTokens; need > best.Capacity {
			return nil, refuse(cp.CodeTooLarge, "prompt (%d tokens) and max_tokens (%d) need %d tokens of state; the largest decode group (%s) holds %d",
				n, out.MaxTokens, need, best.ID, best.Capacity)
		}
	}
	return &out, nil
}

// admitImages checks a submission's images against the model and the
// limits, from their headers (media.Probe; the worker that prefills them
// decodes them), and returns what the prompt needs of each.
func (c *Coordinator) admitImages(req *cp.SubmitRequest) ([]tokenizer.ChatImage, error) {
	if len(req.Images) == 0 {
		return nil, nil
	}
	m, tok := c.cfg.Model, c.cfg.Tokenizer
	if !m.Vision {
		return nil, refuse(cp.CodeBadRequest, "images: model %s has no vision tower (its checkpoint has no vision_tower weights): it reads text only", m.ID)
	}
	if tok == nil {
		return nil, refuse(cp.CodeBadRequest, "images: model %s has no tokenizer, so its image markers are unknown", m.ID)
	}
	if _, ok := tok.SpecialID(tokenizer.MediaPad); !ok {
		return nil, refuse(cp.CodeBadRequest, "images: the tokenizer of model %s has no %s", m.ID, tokenizer.MediaPad)
	}
	imgs, err := c.cfg.Images.Sizes(req.Images, false)
	if err != nil {
		if images.IsTooLarge(err) {
			return nil, refuse(cp.CodeTooLarge, "%v", err)
		}
		return nil, refuse(cp.CodeBadRequest, "%v", err)
	}
	return imgs, nil
}

// thinkingBudget bounds the think channel of a chat reply held to a
// grammar, so that the call or the JSON still comes within max_tokens:
// the request's thinking_budget, else half of max_tokens.
func thinkingBudget(given, maxTokens int) int {
	if given > 0 {
		return given
	}
	return max(1, maxTokens/2)
}

// cancelJob cancels a job: a running job on every worker involved (the
// reply comes once they were told), a queued one before it runs.
func (c *Coordinator) cancelJob(ctx context.Context, req *cp.CancelRequest) (*cp.CancelReply, error) {
	reason := req.Reason
	if reason == "" {
		reason = "cancelled by a client"
	}
	client, err := cp.ClientOf(cp.RequestSubject(ctx))
	if err != nil {
		return nil, refuse(cp.CodeBadRequest, "%v", err)
	}
	// Another client's job is answered as if it did not exist: a client
	// learns nothing of the jobs of others.
	if owner, ok := c.table.Owner(req.JobID); ok && owner != client {
		c.log.Warn("cancel of another client's job refused", zap.String("job", req.JobID), zap.String("client", client))
		return nil, refuse(cp.CodeNotFound, "no job %s here (unknown, or finished long ago)", req.JobID)
	}
	c.mu.Lock()
	r := c.runs[req.JobID]
	c.mu.Unlock()
	if r != nil {
		reply := make(chan *cp.CancelReply, 1)
		r.inbox.put(message{cancel: reason, reply: reply})
		wait, stop := context.WithTimeout(ctx, 2*c.cfg.AssignTimeout+time.Second)
		defer stop()
		select {
		case rep := <-reply:
			return rep, nil
		case <-r.ended:
			select {
			case rep := <-reply: // this cancellation ended it
				return rep, nil
			default: // it ended on its own: the job list says how
			}
		case <-wait.Done():
			return nil, refuse(cp.CodeInternal, "job %s: the cancellation did not complete in %v", req.JobID, 2*c.cfg.AssignTimeout+time.Second)
		}
	}
	ev, ok := c.table.Get(req.JobID)
	switch {
	case !ok:
		return nil, refuse(cp.CodeNotFound, "no job %s here (unknown, or finished long ago)", req.JobID)
	case ev.State.Final():
		return nil, refuse(cp.CodeConflict, "job %s is %s already", req.JobID, ev.State)
	}
	c.mu.Lock()
	c.pendingCancel[req.JobID] = reason
	c.mu.Unlock()
	c.log.Info("queued job marked cancelled", zap.String("job", req.JobID))
	return &cp.CancelReply{JobID: req.JobID, State: cp.StateCancelled}, nil
}

// list answers with each job's latest event, newest first.
func (c *Coordinator) list(ctx context.Context, req *cp.ListJobsRequest) (*cp.ListJobsReply, error) {
	client, err := cp.ClientOf(cp.RequestSubject(ctx))
	if err != nil {
		return nil, refuse(cp.CodeBadRequest, "%v", err)
	}
	if req.JobID != "" {
		return c.lookup(ctx, client, req.JobID)
	}
	limit := req.Limit
	if limit == 0 {
		limit = 100
	}
	return &cp.ListJobsReply{Jobs: c.history(ctx, client, req.State, limit)}, nil
}

// history is client's jobs, newest first: what this coordinator knows (the
// jobs it runs, and those queued or ended since it started), and the
// final events in the results store, which every coordinator shares and a
// restart keeps (for results.ttl). The outputs are left out, as the
// table leaves them out: a job's own lookup returns its output.
func (c *Coordinator) history(ctx context.Context, client string, state cp.JobState, limit int) []cp.JobEvent {
	known := c.table.List(client, state, limit)
	seen := make(map[string]bool, len(known))
	for _, ev := range known {
		seen[ev.JobID] = true
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out := known
	bad, err := c.results.List(rctx, client, func(ev *cp.JobEvent) {
		if seen[ev.JobID] || (state != "" && ev.State != state) {
			return
		}
		if _, ok := c.table.Get(ev.JobID); ok {
			return // this coordinator's own account is newer
		}
		ev.Output = nil
		out = append(out, *ev)
		// Bounded by the limit, however many results are stored.
		if len(out) > 2*limit+len(known) {
			out = jobs.NewestFirst(out, limit)
		}
	})
	if err != nil {
		c.log.Warn("job history: the results store", zap.String("client", client), zap.Error(err))
	}
	if bad > 0 {
		c.log.Warn("job history: results that do not decode were skipped", zap.String("client", client), zap.Int("skipped", bad))
	}
	return jobs.NewestFirst(out, limit)
}

// lookup answers client with one of its jobs' latest event: its final one
// (with its output) from the results, which every coordinator shares, else
// what this coordinator knows. A job this coordinator does not run and
// that has not ended is answered with no jobs: it is queued, or another
// coordinator runs it. Another client's job is not found, as in the list.
func (c *Coordinator) lookup(ctx context.Context, client, id string) (*cp.ListJobsReply, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ev, ok, err := c.results.Get(rctx, client, id)
	if err != nil {
		c.log.Warn("job results", zap.String("job", id), zap.Error(err))
	}
	if ok {
		return &cp.ListJobsReply{Jobs: []cp.JobEvent{*ev}}, nil
	}
	if owner, ok := c.table.Owner(id); ok && owner == client {
		if ev, ok := c.table.Get(id); ok {
			return &cp.ListJobsReply{Jobs: []cp.JobEvent{ev}}, nil
		}
	}
	return &cp.ListJobsReply{Jobs: []cp.JobEvent{}}, nil
}
