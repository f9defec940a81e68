package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/tokenizer"
)

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	refs, aerr := s.plan.imageRefs(&req)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var imgs [][]byte
	if len(refs) > 0 {
		if imgs, aerr = s.readImages(r.Context(), refs); aerr != nil {
			writeError(w, aerr)
			return
		}
	}
	pl, err := s.plan.chat(&req, imgs)
	if err != nil {
		writeError(w, err)
		return
	}
	s.serve(w, r, pl)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	pl, err := s.plan.completion(&req)
	if err != nil {
		writeError(w, err)
		return
	}
	s.serve(w, r, pl)
}

// reader turns generated tokens into deltas.
type reader interface {
	Push(id int) tokenizer.ReplyDelta
	Finish() tokenizer.ReplyDelta
}

// plainReader reads a text completion: every ordinary token is text.
type plainReader struct {
	tok *tokenizer.Tokenizer
	dec *tokenizer.StreamDecoder
}

func (p *plainReader) Push(id int) tokenizer.ReplyDelta {
	d := tokenizer.ReplyDelta{Call: -1}
	if p.tok != nil && !p.tok.IsSpecial(id) {
		d.Content, _ = p.dec.Push(id)
	}
	return d
}

func (p *plainReader) Finish() tokenizer.ReplyDelta {
	d := tokenizer.ReplyDelta{Call: -1}
	if p.dec != nil {
		d.Content = p.dec.Flush()
	}
	return d
}

// response is one request's answer as it is built: the reply read from
// the tokens, and the stream it is written to (streamed requests).
type response struct {
	s      *Server
	pl     *plan
	w      http.ResponseWriter
	rc     *http.ResponseController
	id     string // chatcmpl-... / cmpl-...
	jobID  string
	model  string
	create int64

	read      reader
	stop      tokenizer.StopText
	stopped   bool // a stop text ended the content here
	tokens    []int32
	content   strings.Builder
	reasoning strings.Builder
	calls     []toolCall
	route     *cp.RouteDecision
	committed bool // the status and headers are written
	writeErr  error
}

// serve runs pl's job and answers: a 503 at once when no decode group
// serves the model; otherwise the job's reply, streamed or whole. A client
// that goes away cancels the job.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, pl *plan) {
	if e := s.workers.check(r.Context()); e != nil {
		writeError(w, e)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	j := s.submit(ctx, pl)
	resp := &response{s: s, pl: pl, w: w, rc: http.NewResponseController(w), jobID: j.id, model: s.cfg.ModelName,
		create: time.Now().Unix(), stop: tokenizer.StopText{Stops: pl.stops}}
	prefix := "cmpl-"
	if pl.chat {
		prefix = "chatcmpl-"
		resp.read = s.cfg.Tokenizer.NewReplyParser(pl.reply)
	} else {
		resp.read = &plainReader{tok: s.cfg.Tokenizer}
		if s.cfg.Tokenizer != nil {
			resp.read = &plainReader{tok: s.cfg.Tokenizer, dec: tokenizer.NewStreamDecoder(s.cfg.Tokenizer)}
		}
	}
	resp.id = prefix + bareID(j.id)

	for {
		var gone bool
		select {
		case <-j.wake:
		case <-j.done:
		case <-r.Context().Done():
			gone = true
		}
		items, ended := j.take()
		for _, it := range items {
			resp.add(it)
		}
		if resp.writeErr != nil || gone {
			// The client went away: its job must not run on.
			cancel()
			s.cancel(j.id, "the HTTP client disconnected")
			return
		}
		if resp.stopped {
			// A stop text ended the reply here; the job need not go on.
			cancel()
			s.cancel(j.id, "a stop text ended the reply")
			resp.finish(nil, nil, "stop")
			return
		}
		if ended {
			break
		}
	}
	res, err := j.result()
	resp.finish(res, err, "")
}

// bareID is a job id without its kind prefix ("k-" for a keyed job).
func bareID(id string) string {
	if _, rest, ok := strings.Cut(id, "-"); ok {
		return rest
	}
	return id
}

// cancel cancels a job whose reply is no longer wanted; a job that ended
// meanwhile is fine.
func (s *Server) cancel(jobID, reason string) {
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	if _, err := cp.Cancel(ctx, s.cfg.Conn, jobID, reason); err != nil {
		var re *cp.RemoteError
		if errors.As(err, &re) && (re.Code == cp.CodeConflict || re.Code == cp.CodeNotFound) {
			return
		}
		s.log.Warn("cancelling a job after its request ended", zap.String("job", jobID), zap.Error(err))
	}
}

func (r *response) callID(i int) string {
	return "call_" + bareID(r.jobID) + "_" + strconv.Itoa(i)
}

// add takes one event or token of the job.
func (r *response) add(it item) {
	if ev := it.ev; ev != nil {
		if ev.Route != nil {
			r.route = ev.Route
		}
		if ev.State == cp.StateRouted && r.pl.stream {
			r.commit()
		}
		return
	}
	t := it.tok
	if t.TokenID < 0 {
		return // the final message: the job's end follows
	}
	if t.Index < len(r.tokens) {
		// The job runs again from the start (a coordinator handed it
		// back): its tokens repeat what was sent, which cannot be unsent.
		if r.tokens[t.Index] != t.TokenID {
			r.writeErr = fmt.Errorf("job %s ran again and generated other tokens than those already sent", r.jobID)
		}
		return
	}
	r.tokens = append(r.tokens, t.TokenID)
	r.delta(r.read.Push(int(t.TokenID)))
}

// delta applies a piece of the reply: to the stream, and to the whole.
func (r *response) delta(d tokenizer.ReplyDelta) {
	if d.Content != "" && !r.stopped {
		d.Content, r.stopped = r.stop.Push(d.Content)
	} else {
		d.Content = ""
	}
	if d.Empty() {
		return
	}
	r.content.WriteString(d.Content)
	r.reasoning.WriteString(d.Reasoning)
	var dc *toolCall
	if d.Call >= 0 {
		if d.Start {
			r.calls = append(r.calls, toolCall{ID: r.callID(d.Call), Type: "function", Function: callFunction{Name: d.Name}})
		}
		if d.Call >= len(r.calls) {
			return
		}
		c := &r.calls[d.Call]
		c.Function.Arguments += d.Arguments
		i := d.Call
		dc = &toolCall{Index: &i, Function: callFunction{Arguments: d.Arguments}}
		if d.Start {
			dc.ID, dc.Type, dc.Function.Name = c.ID, c.Type, c.Function.Name
		}
	}
	if !r.pl.stream {
		return
	}
	r.commit()
	if d.Reasoning != "" {
		r.chunk(&respMessage{ReasoningContent: &d.Reasoning}, "", nil, nil, nil)
	}
	if d.Content != "" {
		r.chunk(&respMessage{Content: &d.Content}, d.Content, nil, nil, nil)
	}
	if dc != nil {
		r.chunk(&respMessage{ToolCalls: []toolCall{*dc}}, "", nil, nil, nil)
	}
	r.flush()
}

// commit writes a stream's status and headers, with the route, and its
// first chunk (the assistant's role, and a call the prompt opened).
func (r *response) commit() {
	if r.committed {
		return
	}
	r.committed = true
	h := r.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	r.routeHeaders(h)
	r.w.WriteHeader(http.StatusOK)
	if r.pl.chat {
		empty := ""
		r.chunk(&respMessage{Role: "assistant", Content: &empty}, "", nil, nil, nil)
	}
	r.flush()
}

func (r *response) routeHeaders(h http.Header) {
	h.Set("X-Tandem-Job-Id", r.jobID)
	if rt := r.route; rt != nil {
		h.Set("X-Tandem-Route", string(rt.Target))
		h.Set("X-Tandem-Predicted-Ttft-Local-Ms", ms(rt.PredictedLocal))
		h.Set("X-Tandem-Predicted-Ttft-Remote-Ms", ms(rt.PredictedRemote))
	}
}

func ms(d time.Duration) string { return strconv.FormatFloat(msf(d), 'f', 3, 64) }

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// chunk writes one server-sent event: a chat delta, or text of a
// completion, or (choices empty) the usage.
func (r *response) chunk(delta *respMessage, text string, finish *string, u *usage, info *tandemInfo) {
	var v any
	if r.pl.chat {
		c := chatChunk{ID: r.id, Object: "chat.completion.chunk", Created: r.create, Model: r.model, Usage: u, Tandem: info,
			Choices: []chatChoice{}}
		if delta != nil {
			c.Choices = append(c.Choices, chatChoice{Delta: delta, FinishReason: finish})
		}
		v = c
	} else {
		c := textCompletion{ID: r.id, Object: "text_completion", Created: r.create, Model: r.model, Usage: u, Tandem: info,
			Choices: []textChoice{}}
		if delta != nil {
			c.Choices = append(c.Choices, textChoice{Text: text, FinishReason: finish})
		}
		v = c
	}
	r.event(v)
}

func (r *response) event(v any) {
	if r.writeErr != nil {
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		r.writeErr = err
		return
	}
	_, r.writeErr = fmt.Fprintf(r.w, "data: %s\n\n", b)
}

func (r *response) flush() {
	if r.writeErr == nil {
		r.writeErr = r.rc.Flush()
	}
}

// finish ends the answer: an error status (or an error event, when the
// stream is already under way), or the final chunk or object with the
// finish reason, the usage and tandem's figures.
func (r *response) finish(res *client.Result, err error, reason string) {
	if res != nil && err == nil {
		switch res.Final.State {
		case cp.StateFailed:
			err = res.Err()
		case cp.StateCancelled:
			err = newErr(http.StatusInternalServerError, "server_error", "cancelled", "", "job %s was cancelled: %s", r.jobID, res.Final.Detail)
		}
	}
	if err != nil {
		ae := fromJob(err)
		r.s.log.Info("request failed", zap.String("job", r.jobID), zap.Int("status", ae.Status), zap.String("error", ae.Message))
		if !r.committed {
			writeError(r.w, ae)
			return
		}
		r.event(errorBody{Error: ae})
		r.flush()
		return
	}
	if !r.stopped {
		r.delta(r.read.Finish())
		if !r.stopped {
			r.delta(tokenizer.ReplyDelta{Call: -1, Content: r.stop.Flush()})
		}
	}
	if reason == "" {
		reason = finishReason(res.Finish, r.read)
	}
	u := &usage{PromptTokens: len(r.pl.prompt), CompletionTokens: len(r.tokens)}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	info := r.info(res)
	if info.Timing != nil && info.Timing.CachedTokens > 0 {
		u.PromptTokensDetails = &promptDetails{CachedTokens: info.Timing.CachedTokens}
	}
	if r.pl.stream {
		r.commit()
		if r.pl.includeUsage {
			r.chunk(&respMessage{}, "", &reason, nil, nil)
			r.chunk(nil, "", nil, u, info)
		} else {
			r.chunk(&respMessage{}, "", &reason, nil, info)
		}
		_, _ = fmt.Fprint(r.w, "data: [DONE]\n\n")
		r.flush()
		return
	}
	h := r.w.Header()
	r.routeHeaders(h)
	if info.Timing != nil {
		t := info.Timing
		h.Set("X-Tandem-Ttft-Ms", strconv.FormatFloat(info.TTFTMs, 'f', 3, 64))
		for name, v := range map[string]float64{"Queue": t.QueueMs, "Pass-Wait": t.PassWaitMs, "Prefill": t.PrefillMs,
			"Transfer-Tail": t.TransferTailMs, "Decode": t.DecodeMs, "Total": t.TotalMs} {
			h.Set("X-Tandem-"+name+"-Ms", strconv.FormatFloat(v, 'f', 3, 64))
		}
		if t.CachedTokens > 0 {
			h.Set("X-Tandem-Cached-Tokens", strconv.Itoa(t.CachedTokens))
			h.Set("X-Tandem-Cached-On", t.CachedOn)
		}
		if t.DecodeSteps > 0 {
			h.Set("X-Tandem-Decode-Steps", strconv.Itoa(t.DecodeSteps))
			h.Set("X-Tandem-Accepted-Per-Step", strconv.FormatFloat(t.AcceptedPerStep, 'f', 3, 64))
		}
	}
	if !r.pl.chat {
		writeJSON(r.w, http.StatusOK, textCompletion{ID: r.id, Object: "text_completion", Created: r.create, Model: r.model,
			Choices: []textChoice{{Text: r.content.String(), FinishReason: &reason}}, Usage: u, Tandem: info})
		return
	}
	msg := &respMessage{Role: "assistant"}
	if content := r.content.String(); content != "" || len(r.calls) == 0 {
		msg.Content = &content
	}
	if reasoning := r.reasoning.String(); reasoning != "" {
		msg.ReasoningContent = &reasoning
	}
	msg.ToolCalls = r.calls
	writeJSON(r.w, http.StatusOK, chatCompletion{ID: r.id, Object: "chat.completion", Created: r.create, Model: r.model,
		Choices: []chatChoice{{Message: msg, FinishReason: &reason}}, Usage: u, Tandem: info})
}

// finishReason is the choice's finish_reason: the job's, except that a
// chat turn the model ended with complete calls finishes "tool_calls", and
// one whose structure the parser could not read (kept as content)
// finishes "malformed".
func finishReason(job cp.FinishReason, read reader) string {
	reason := string(job)
	if reason == "" {
		reason = string(cp.FinishStop)
	}
	p, ok := read.(*tokenizer.ReplyParser)
	if !ok || reason != string(cp.FinishStop) {
		return reason
	}
	switch {
	case p.Malformed():
		return "malformed"
	case p.Closed() > 0:
		return "tool_calls"
	}
	return reason
}

// info is tandem's account of the job for the final object.
func (r *response) info(res *client.Result) *tandemInfo {
	in := &tandemInfo{JobID: r.jobID}
	if rt := r.route; rt != nil {
		in.Route, in.Policy, in.PrefillWorker, in.DecodeGroup = string(rt.Target), string(rt.Policy), rt.PrefillWorker, rt.DecodeGroup
		in.PredictedTTFTLocalMs, in.PredictedTTFTRemote = msf(rt.PredictedLocal), msf(rt.PredictedRemote)
	}
	if res != nil && res.Final.Timing != nil {
		t := res.Final.Timing
		in.TTFTMs = msf(t.FirstToken)
		in.Timing = &timingInfo{QueueMs: msf(t.Queue), PassWaitMs: msf(t.PassWait), PrefillMs: msf(t.Prefill),
			TransferTailMs: msf(t.TransferTail), FirstTokenMs: msf(t.FirstToken), DecodeMs: msf(t.Decode), TotalMs: msf(t.Total),
			DecodeTokPerS: t.DecodeTokensPerSec, CachedTokens: t.CachedTokens, CachedOn: t.CachedOn}
		if sp := t.Speculation; sp != nil && sp.Steps > 0 {
			ti := in.Timing
			ti.DecodeSteps, ti.DraftedTokens, ti.AcceptedTokens = sp.Steps, sp.Drafted, sp.Accepted
			ti.AcceptedPerStep = float64(sp.Accepted) / float64(sp.Steps)
		}
	}
	return in
}
