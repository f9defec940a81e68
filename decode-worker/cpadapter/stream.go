package cpadapter

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/decode-worker/pipeline"
	"github.com/tandem-inference/tandem/tokenizer"
)

// stream is one job's sink on rank 0: it turns the group's tokens into
// TokenMsg (with text, stop texts applied) and Progress messages. The
// group calls Token and End from its loop, which must never wait, so they
// only queue; the stream's own goroutine detokenizes and publishes.
type stream struct {
	a        *Adapter
	id       string
	tokens   string // the subject of the job's tokens, in its client's namespace
	enc      cp.Encoding
	prompt   int // prompt tokens (run here or cached)
	local    bool
	stopIDs  map[int32]bool
	dec      *tokenizer.StreamDecoder
	reply    *tokenizer.ReplyParser // a chat job's: reads the tokens as K3's reply
	text     tokenizer.StopText
	reserved uint64
	log      *zap.Logger

	mu         sync.Mutex
	items      []item
	wake       chan struct{}
	cancelled  string      // the coordinator's reason, once it cancelled
	isAdmitted bool        // the group admitted the sequence and the coordinator was told
	silent     bool        // cancelled during admission: publish nothing
	latest     cp.Progress // the latest report, for a coordinator taking the job over
	final      *cp.Progress

	// Owned by run.
	count    int
	first    time.Time
	last     time.Time // the latest token
	reported time.Time // the last decoding progress
	stopped  bool      // a stop text ended the job
	out      []int32   // the tokens published
	outText  strings.Builder
	thinking strings.Builder // a chat's think channel
	calls    []cp.ToolCall   // a chat's calls
}

type item struct {
	end     bool
	abandon bool
	index   int
	token   int32
	at      time.Time // when the group's loop gave the token
	res     pipeline.Result
}

var _ pipeline.Sink = (*stream)(nil)

// progressEvery spaces the decoding reports of a job.
const progressEvery = 2 * time.Second

func (a *Adapter) newStream(as *cp.Assignment, req *pipeline.Request) *stream {
	enc, _ := cp.EncodingNamed(as.Encoding) // validated with the assignment
	s := &stream{a: a, id: as.JobID, tokens: cp.ClientJobTokens(as.Client, as.JobID), enc: enc, prompt: len(req.Tokens) + as.CachedTokens, local: as.CachedTokens == 0,
		stopIDs: map[int32]bool{}, text: tokenizer.StopText{Stops: as.Sampling.Stop.Texts}, wake: make(chan struct{}, 1),
		log: a.log.With(zap.String("job", as.JobID))}
	s.latest = cp.Progress{JobID: as.JobID, WorkerID: a.cfg.WorkerID, Stage: cp.StatePrefilling, Time: time.Now()}
	s.reserved = uint64(a.stateBytes(s.prompt + req.MaxTokens))
	for _, id := range req.Stop {
		s.stopIDs[id] = true
	}
	if a.cfg.Tokenizer != nil {
		s.dec = tokenizer.NewStreamDecoder(a.cfg.Tokenizer)
		if r := as.Sampling.Reply; r != nil {
			s.reply = a.cfg.Tokenizer.NewReplyParser(tokenizer.ReplyOptions{Thinking: r.Thinking, Tools: r.Tools})
		}
	}
	go s.run()
	return s
}

// Token queues a token (from the group's loop).
// The token is timed here, not when the stream's goroutine gets to it: on
// a loaded machine that can come after the group's end (Result.Timing),
// which would make the job's decode time negative.
func (s *stream) Token(_ string, index int, token int32) {
	s.push(item{index: index, token: token, at: time.Now()})
}

// End queues the end (from the group's loop).
func (s *stream) End(_ string, r pipeline.Result) { s.push(item{end: true, res: r}) }

// abandon ends a stream whose sequence was never admitted: nothing is
// published (the coordinator has the refusal).
func (s *stream) abandon() { s.push(item{abandon: true}) }

// markCancelled records the coordinator's cancellation and reports whether
// the sequence is admitted (else the admission in progress drops it).
func (s *stream) markCancelled(reason string) (admitted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reason == "" {
		reason = "cancelled by the coordinator"
	}
	s.cancelled = reason
	return s.isAdmitted
}

// admitted marks the sequence admitted, unless it was cancelled meanwhile:
// then the stream goes silent and the reason is returned.
func (s *stream) admitted() (reason string, cancelled bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancelled != "" {
		s.silent = true
		return s.cancelled, true
	}
	s.isAdmitted = true
	return "", false
}

func (s *stream) push(it item) {
	s.mu.Lock()
	s.items = append(s.items, it)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// snapshot is the job's latest report.
func (s *stream) snapshot() *cp.Progress {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.latest
	return &p
}

func (s *stream) run() {
	defer func() {
		s.mu.Lock()
		final := s.final
		if s.silent {
			final = nil
		}
		s.mu.Unlock()
		s.a.done(s.id, final)
	}()
	for {
		<-s.wake
		s.mu.Lock()
		items := s.items
		s.items = nil
		s.mu.Unlock()
		for _, it := range items {
			switch {
			case it.abandon:
				return
			case it.end:
				s.end(it.res)
				return
			default:
				s.token(it.index, it.token, it.at)
			}
		}
	}
}

func (s *stream) token(index int, id int32, now time.Time) {
	if s.stopped {
		return // tokens already in flight when a stop text ended the job
	}
	if s.first.IsZero() {
		s.first = now
	} else {
		s.a.cfg.Metrics.gap(now.Sub(s.last))
	}
	s.last = now
	// The first token, then a sign of life every few seconds: the
	// coordinator fails a decoding job that goes silent.
	if now.Sub(s.reported) >= progressEvery {
		s.reported = now
		s.publish(cp.WorkerProgress(s.a.cfg.WorkerID, s.id), &cp.Progress{JobID: s.id, WorkerID: s.a.cfg.WorkerID, Stage: cp.StateDecoding,
			Time: now, Tokens: index + 1, Elapsed: now.Sub(s.first)})
	}
	msg := &cp.TokenMsg{JobID: s.id, Index: index, TokenID: id}
	switch {
	case s.reply != nil:
		s.chat(msg, s.reply.Push(int(id)))
	case s.dec != nil && !s.stopIDs[id]:
		piece, err := s.dec.Push(int(id))
		if err != nil {
			s.log.Warn("token does not decode", zap.Int32("token", id), zap.Error(err))
		}
		msg.Text, s.stopped = s.text.Push(piece)
	}
	s.publish(s.tokens, msg)
	s.count = index + 1
	s.out = append(s.out, id)
	s.outText.WriteString(msg.Text)
	if s.stopped {
		// The group keeps stepping until the cancel lands; those tokens
		// are dropped above.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.a.cfg.Worker.Cancel(ctx, s.id); err != nil {
			s.log.Warn("cancel after a stop text", zap.Error(err))
		}
	}
}

// chat fills a chat job's token message from the reply's delta: the
// response channel as the text (stop texts apply to it), the think channel
// and the call apart.
func (s *stream) chat(msg *cp.TokenMsg, d tokenizer.ReplyDelta) {
	if d.Content != "" && !s.stopped {
		msg.Text, s.stopped = s.text.Push(d.Content)
	}
	msg.Reasoning = d.Reasoning
	s.thinking.WriteString(d.Reasoning)
	if d.Call < 0 || d.Call >= cp.MaxToolCalls {
		return
	}
	if d.Start {
		s.calls = append(s.calls, cp.ToolCall{Name: d.Name})
	}
	if d.Call < len(s.calls) {
		s.calls[d.Call].Arguments += d.Arguments
		msg.Call = &cp.CallDelta{Index: d.Call, Arguments: d.Arguments}
		if d.Start {
			msg.Call.Name = d.Name
		}
	}
}

func (s *stream) end(r pipeline.Result) {
	s.mu.Lock()
	cancelledBy := s.cancelled
	s.mu.Unlock()
	var rest string
	var last cp.TokenMsg
	switch {
	case s.stopped:
	case s.reply != nil:
		s.chat(&last, s.reply.Finish())
		rest = last.Text
		if !s.stopped {
			rest += s.text.Flush()
		}
	case s.dec != nil:
		var stop bool
		rest, stop = s.text.Push(s.dec.Flush())
		if !stop {
			rest += s.text.Flush()
		}
	}
	reason := cp.FinishReason(r.Reason)
	stage := cp.StateDone
	p := &cp.Progress{JobID: s.id, WorkerID: s.a.cfg.WorkerID, Time: time.Now(), Tokens: s.count, Cached: r.Cached}
	if r.Steps > 0 {
		p.Speculation = &cp.Speculation{Steps: r.Steps, Drafted: r.Drafted, Accepted: r.Accepted}
	}
	switch {
	case s.stopped:
		reason = cp.FinishStop
	case r.Reason == pipeline.ReasonCancelled:
		stage = cp.StateCancelled
		if cancelledBy == "" {
			cancelledBy = "cancelled on the decode group"
		}
		p.Error = &cp.JobError{Code: cp.CodeConflict, Worker: s.a.cfg.WorkerID, Message: cancelledBy}
	case r.Reason == pipeline.ReasonError:
		stage = cp.StateFailed
		msg := "the decode group ended the sequence with an error"
		if r.Err != nil {
			msg = r.Err.Error()
		}
		p.Error = &cp.JobError{Code: cp.CodeInternal, Worker: s.a.cfg.WorkerID, Message: msg}
	}
	p.Stage = stage
	if !s.first.IsZero() {
		end := r.Timing.Ended
		if end.IsZero() {
			end = p.Time
		}
		p.Elapsed = max(end.Sub(s.first), 0)
		m := &cp.Rates{}
		if s.count > 1 && p.Elapsed > 0 {
			m.DecodeTokensPerSec = float64(s.count-1) / p.Elapsed.Seconds()
		}
		if s.local && !r.Timing.Admitted.IsZero() && r.Timing.FirstToken.After(r.Timing.Admitted) {
			// The rate of what the group prefilled: the cached prefix was not.
			m.PrefillTokensPerSec = float64(max(s.prompt-r.Cached, 1)) / r.Timing.FirstToken.Sub(r.Timing.Admitted).Seconds()
			s.a.observeLocal(s.prompt, r.Cached, r.Timing)
		}
		p.Measured = m
	}
	s.outText.WriteString(rest)
	p.Output = &cp.Output{TokenIDs: s.out, Text: s.outText.String(), FinishReason: reason}
	if s.reply != nil {
		p.Output.Reasoning, p.Output.ToolCalls, p.Output.Malformed = s.thinking.String(), s.calls, s.reply.Malformed()
	}
	s.mu.Lock()
	s.final = p
	s.mu.Unlock()
	// The final token message goes out before the final progress, so a
	// client that sees the job end has every token.
	s.publish(s.tokens, &cp.TokenMsg{JobID: s.id, Index: s.count, TokenID: -1, Text: rest, Reasoning: last.Reasoning, Call: last.Call,
		Final: true, FinishReason: reason})
	s.publish(cp.WorkerProgress(s.a.cfg.WorkerID, s.id), p)
	s.log.Info("job ended", zap.String("finish", string(reason)), zap.Int("tokens", s.count), zap.Duration("decode", p.Elapsed))
}

func (s *stream) publish(subject string, m cp.Message) {
	s.mu.Lock()
	silent := s.silent
	if p, ok := m.(*cp.Progress); ok && !silent {
		s.latest = *p
	}
	s.mu.Unlock()
	if silent {
		return
	}
	enc := cp.MsgPack
	if subject == s.tokens {
		enc = s.enc // the client's tokens, in its submission's encoding
	}
	if err := cp.PublishAs(s.a.cfg.Conn, subject, enc, m); err != nil {
		s.log.Warn("publish failed", zap.String("subject", subject), zap.Error(err))
	}
}
