package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tandem-inference/tandem/bench/sim"
	"github.com/tandem-inference/tandem/bench/workload"
	cp "github.com/tandem-inference/tandem/controlplane"
	"github.com/tandem-inference/tandem/coordinator/client"
	"github.com/tandem-inference/tandem/coordinator/router"
)

// measured is one replayed job as the bench saw it.
type measured struct {
	Job workload.Job
	// JobID is the coordinator's id of the job.
	JobID string
	// Submitted is when the submission was sent; FirstToken and LastToken
	// when the client received the first and the last token.
	Submitted, FirstToken, LastToken time.Time
	Tokens                           int
	// Output is the generated token ids.
	Output []int32
	// Final is the job's final event (route and timing); Events all of
	// them.
	Final  cp.JobEvent
	Events []cp.JobEvent
	// Bytes is the state the prefill worker sent (remote jobs).
	Bytes int64
	// Err is why the job did not complete (nil when it did).
	Err error
}

// promptTokens is a job's prompt: its own token ids (a rendered chat), or
// token ids that depend on its session (or on the job alone), so that an
// agent session's turns extend one another as a growing conversation does.
func promptTokens(j workload.Job, vocab int) []int32 {
	if j.Tokens != nil {
		return j.Tokens
	}
	h := fnv.New64a()
	if j.Session != "" {
		h.Write([]byte(j.Session))
	} else {
		h.Write([]byte(j.ID))
	}
	seed := h.Sum64() % uint64(vocab)
	out := make([]int32, j.Prompt)
	for i := range out {
		out[i] = int32((seed + uint64(i)*104729 + 13) % uint64(vocab))
	}
	return out
}

// replay submits every job at its arrival time (from now) under policy,
// follows each to its end and returns what happened to each, in the jobs'
// order, with the time the replay started. Each job gets jobTimeout; the
// key prefix makes the jobs' idempotency keys unique to this replay.
func replay(ctx context.Context, nc *nats.Conn, jobs []workload.Job, policy cp.Policy, vocab int, key string, jobTimeout time.Duration, inTurn bool) ([]measured, time.Time, error) {
	out := make([]measured, len(jobs))
	var mu sync.Mutex
	bytes := map[string]int64{}
	sub, err := nc.Subscribe(cp.SubjectAllProgress, func(m *nats.Msg) {
		var p cp.Progress
		if _, err := cp.DecodeMsg(m, &p); err != nil || p.WorkerID != prefillID || p.Stage != cp.StateDone {
			return
		}
		mu.Lock()
		bytes[p.JobID] = int64(p.Bytes)
		mu.Unlock()
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("e2e: subscribe to job progress: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		return nil, time.Time{}, fmt.Errorf("e2e: subscribe to job progress: %w", err)
	}

	start := time.Now()
	var wg sync.WaitGroup
	for i, j := range jobs {
		if inTurn {
			// Each job alone on the system, submitted when the one
			// before it ended.
			out[i] = runJob(ctx, nc, j, time.Now(), policy, vocab, key, jobTimeout)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = runJob(ctx, nc, j, start.Add(j.Arrival), policy, vocab, key, jobTimeout)
		}()
	}
	wg.Wait()
	// The prefill worker reports a job's bytes once its transfer is
	// committed, which can be after the job's last token: wait for every
	// remote job's report (briefly).
	deadline := time.Now().Add(2 * time.Second)
	for {
		mu.Lock()
		missing := 0
		for i := range out {
			if rt := out[i].Final.Route; out[i].Err == nil && rt != nil && rt.Target == cp.TargetRemote {
				if _, ok := bytes[out[i].JobID]; !ok {
					missing++
				}
			}
		}
		if missing == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			for i := range out {
				out[i].Bytes = bytes[out[i].JobID]
			}
			mu.Unlock()
			break
		}
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	return out, start, ctx.Err()
}

func runJob(ctx context.Context, nc *nats.Conn, j workload.Job, at time.Time, policy cp.Policy, vocab int, key string, timeout time.Duration, opts ...func(*cp.SubmitRequest)) measured {
	m := measured{Job: j}
	select {
	case <-time.After(time.Until(at)):
	case <-ctx.Done():
		m.Err = ctx.Err()
		return m
	}
	jctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req := cp.SubmitRequest{TokenIDs: promptTokens(j, vocab), Sampling: cp.Sampling{MaxTokens: j.Output}, Policy: policy,
		IdempotencyKey: key + "-" + j.ID}
	for _, o := range opts {
		o(&req)
	}
	res, err := client.Run(jctx, nc, req, client.Handlers{Token: func(t cp.TokenMsg) {
		now := time.Now()
		if t.TokenID < 0 {
			return // a final message without a token
		}
		if m.FirstToken.IsZero() || t.Index == 0 {
			m.FirstToken = now // (again, if the job ran again from the start)
		}
		m.LastToken = now
	}})
	if res != nil {
		m.JobID, m.Submitted, m.Final, m.Events, m.Tokens, m.Output = res.JobID, res.Submitted, res.Final, res.Events, len(res.Tokens), res.Tokens
		if err == nil {
			err = res.Err()
		}
	}
	if err != nil && jctx.Err() != nil && ctx.Err() == nil && m.JobID != "" {
		// Out of time: cancel it, or it keeps the workers from the jobs
		// after it (a long local prefill held the decode group's head, and
		// every later assignment to it timed out).
		cctx, stop := context.WithTimeout(ctx, 30*time.Second)
		if _, cerr := cp.Cancel(cctx, nc, m.JobID, "bench e2e: job timeout"); cerr != nil {
			err = fmt.Errorf("%w (and cancelling it: %v)", err, cerr)
		}
		stop()
	}
	switch {
	case err != nil:
		m.Err = err
	case m.Final.State != cp.StateDone:
		m.Err = fmt.Errorf("job %s ended %s", m.JobID, m.Final.State)
	case m.FirstToken.IsZero():
		m.Err = fmt.Errorf("job %s ended without a token", m.JobID)
	}
	return m
}

// measuredResult turns a replay into the simulator's result type, so that
// the measured and the predicted runs are summarised by the same code
// (sim.Summarize). Times are since start. A job's TTFT is the client's:
// submission sent to first token received. Its parts: remote, queue (to
// the start of its first weight pass), prefill (the pass), transfer tail
// (the coordinator's marks, as measured), and first step (the rest: the
// decode group's first step and the hops to the client; 0 when the commit
// was marked after the first token, see lateMark); local, queue (to the
// decode group's start on it) and prefill (the group's prefill and first
// step, one figure in the coordinator's timing). Done is the first token
// plus the decode group's own measure of its decoding.
func measuredResult(policy router.Policy, start time.Time, ms []measured, passes []passRecord) *sim.Result {
	r := &sim.Result{Setup: "measured", Policy: policy}
	perJob := map[string]int{}
	for i, p := range passes {
		pr := sim.PassResult{Index: i + 1, Start: p.End.Add(-p.Rep.Stats.Wall).Sub(start), End: p.End.Sub(start),
			Jobs: len(p.Rep.Plan.Pieces), Tokens: p.Rep.Plan.Tokens, Depth: p.Rep.Plan.Depth, Tile: p.Rep.Plan.Tile,
			Read: p.Rep.Stats.ReadWall, Compute: p.Rep.Stats.Compute, ReadWait: p.Rep.Stats.ReadWait, Bytes: p.Rep.Stats.Bytes}
		for _, pc := range p.Rep.Plan.Pieces {
			perJob[pc.ID]++
		}
		r.Passes = append(r.Passes, pr)
	}
	for _, m := range ms {
		j := sim.JobResult{ID: m.Job.ID, Session: m.Job.Session, Turn: m.Job.Turn, Prompt: m.Job.Prompt, Output: m.Job.Output,
			Arrival: m.Job.Arrival, Bytes: m.Bytes, Passes: perJob[m.JobID]}
		if !m.Submitted.IsZero() {
			j.Arrival = m.Submitted.Sub(start)
		}
		if rt := m.Final.Route; rt != nil {
			j.Target = router.Target(rt.Target)
			j.Decision = router.Decision{Policy: router.Policy(rt.Policy), Target: j.Target, Reason: rt.Reason,
				Local: router.Prediction{Total: rt.PredictedLocal}, Remote: router.Prediction{Total: rt.PredictedRemote}}
		}
		if m.Err != nil {
			j.Refused = m.Err.Error()
			r.Jobs = append(r.Jobs, j)
			continue
		}
		j.Output = m.Tokens
		j.TTFT = m.FirstToken.Sub(m.Submitted)
		j.FirstToken = m.FirstToken.Sub(start)
		j.Done = m.LastToken.Sub(start)
		if t := m.Final.Timing; t != nil {
			// Tokens reach the client in bursts; the decode group's own
			// measure of first to last token times the decoding.
			if t.Decode > 0 {
				j.Done = j.FirstToken + t.Decode
			}
			if j.Target == router.TargetRemote {
				j.Prefill, j.TransferTail = t.Prefill, t.TransferTail
				j.Queue = t.Queue + t.PassWait
			} else {
				j.Prefill = t.Prefill
			}
		}
		if j.Target == router.TargetRemote {
			// The parts are the coordinator's marks as measured, TTFT the
			// client's; first step is what the TTFT leaves after them. The
			// reports of the prefill worker and of rank 0 reach the
			// coordinator on their own connections, so the commit can be
			// marked after the client already has the first token: then
			// the parts add up to more than the TTFT, first step is 0 and
			// lateMark says by how much.
			j.FirstStep = max(0, j.TTFT-j.Queue-j.Prefill-j.TransferTail)
		} else {
			// One figure in the coordinator's timing covers the group's
			// prefill and first step; queue is the rest of the TTFT, the
			// control plane's hops included (0 when rank 0's report of
			// the first token reached the coordinator late, see lateMark).
			j.Queue = max(0, j.TTFT-j.Prefill)
		}
		r.End = max(r.End, j.Done)
		r.LinkBytes += j.Bytes
		r.Jobs = append(r.Jobs, j)
	}
	return r
}

// lateMark is how long after the client's first token the coordinator
// marked the end of a job's last measured part (a remote job's commit, a
// local job's first token): by how much its parts add up to more than its
// TTFT. It is 0 for a job marked in time and for a simulated one.
func lateMark(j sim.JobResult) time.Duration {
	return max(0, j.Queue+j.Prefill+j.TransferTail+j.FirstStep-j.TTFT)
}

// mergeResults joins replays of the same jobs into one result, each after
// the one before (its times shifted by the previous ones' end), so that
// percentiles are over every job and jobs per minute over the whole time.
func mergeResults(rs []*sim.Result) *sim.Result {
	if len(rs) == 1 {
		return rs[0]
	}
	out := &sim.Result{Setup: "measured"}
	var off time.Duration
	for _, r := range rs {
		out.Policy = r.Policy
		for _, j := range r.Jobs {
			j.Arrival += off
			if j.Refused == "" {
				j.FirstToken += off
				j.Done += off
			}
			out.Jobs = append(out.Jobs, j)
		}
		for _, p := range r.Passes {
			p.Index = len(out.Passes) + 1
			p.Start += off
			p.End += off
			out.Passes = append(out.Passes, p)
		}
		out.LinkBytes += r.LinkBytes
		out.End = off + r.End
		off = out.End
	}
	return out
}
