// Package workload describes the jobs a benchmark replays: when each arrives,
// how long its prompt is and how many tokens it generates. Workloads come
// from trace files (trace.go) or are generated (generate.go): a mix of short
// and long prompts with Poisson arrivals, and agent-like sessions whose
// prompts grow turn by turn. The simulator (bench/sim) and the end-to-end
// benchmark replay the same jobs.
package workload

import (
	"fmt"
	"sort"
	"time"
)

// Job is one request of a workload.
type Job struct {
	ID string `json:"id"`
	// Arrival is the time since the workload's start at which the job is
	// submitted.
	Arrival time.Duration `json:"-"`
	// Prompt is the prompt length in tokens (at least 1); Output the tokens
	// to generate (at least 1: the first token).
	Prompt int `json:"prompt_tokens"`
	Output int `json:"output_tokens"`
	// Session groups the turns of one agent-like conversation ("" for a
	// lone request); Turn counts from 0 within it.
	Session string `json:"session,omitempty"`
	Turn    int    `json:"turn,omitempty"`
	// Tokens, when set, are the prompt's token ids (Prompt of them): a
	// chat rendered for the model (bench e2e --chat). Unset, a replay makes
	// ids of its own.
	Tokens []int32 `json:"-"`
}

// Validate checks one job.
func (j Job) Validate() error {
	switch {
	case j.ID == "":
		return fmt.Errorf("job id is empty")
	case j.Arrival < 0:
		return fmt.Errorf("job %s: arrival %v is negative", j.ID, j.Arrival)
	case j.Prompt < 1:
		return fmt.Errorf("job %s: prompt of %d tokens, want at least 1", j.ID, j.Prompt)
	case j.Output < 1:
		return fmt.Errorf("job %s: %d output tokens, want at least 1", j.ID, j.Output)
	case j.Turn < 0:
		return fmt.Errorf("job %s: turn %d is negative", j.ID, j.Turn)
	case j.Tokens != nil && len(j.Tokens) != j.Prompt:
		return fmt.Errorf("job %s: %d prompt token ids for a prompt of %d tokens", j.ID, len(j.Tokens), j.Prompt)
	}
	return nil
}

// Validate checks every job and that ids are unique.
func Validate(jobs []Job) error {
	seen := make(map[string]bool, len(jobs))
	for i, j := range jobs {
		if err := j.Validate(); err != nil {
			return fmt.Errorf("job %d: %w", i, err)
		}
		if seen[j.ID] {
			return fmt.Errorf("job %d: id %s is used twice", i, j.ID)
		}
		seen[j.ID] = true
	}
	return nil
}

// Sort orders jobs by arrival, keeping the given order among equal times.
func Sort(jobs []Job) {
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].Arrival < jobs[b].Arrival })
}

// Stats summarises a workload.
type Stats struct {
	Jobs, Sessions          int
	PromptTokens            int64
	MinPrompt, MaxPrompt    int
	OutputTokens            int64
	Span                    time.Duration // first to last arrival
	ArrivalsPerMin          float64
	MedianPrompt, P90Prompt int
}

// Summarize computes a workload's statistics.
func Summarize(jobs []Job) Stats {
	var s Stats
	s.Jobs = len(jobs)
	if len(jobs) == 0 {
		return s
	}
	sessions := map[string]bool{}
	prompts := make([]int, 0, len(jobs))
	first, last := jobs[0].Arrival, jobs[0].Arrival
	s.MinPrompt = jobs[0].Prompt
	for _, j := range jobs {
		if j.Session != "" {
			sessions[j.Session] = true
		}
		s.PromptTokens += int64(j.Prompt)
		s.OutputTokens += int64(j.Output)
		s.MinPrompt = min(s.MinPrompt, j.Prompt)
		s.MaxPrompt = max(s.MaxPrompt, j.Prompt)
		first, last = min(first, j.Arrival), max(last, j.Arrival)
		prompts = append(prompts, j.Prompt)
	}
	s.Sessions = len(sessions)
	s.Span = last - first
	if s.Span > 0 {
		s.ArrivalsPerMin = float64(len(jobs)-1) / s.Span.Minutes()
	}
	sort.Ints(prompts)
	s.MedianPrompt = prompts[(len(prompts)-1)/2]
	s.P90Prompt = prompts[(len(prompts)-1)*9/10]
	return s
}
