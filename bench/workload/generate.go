package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// MixSpec describes a stream of independent requests: short prompts (chat
// turns, tool results) and long ones (documents, code bases) arriving as a
// Poisson process. Prompt lengths are log-uniform within each range.
type MixSpec struct {
	Seed uint64
	Jobs int
	// PerMin is the mean arrival rate (jobs per minute).
	PerMin float64
	// ShortMin..ShortMax and LongMin..LongMax are the prompt ranges in
	// tokens; LongFraction is the share of long prompts.
	ShortMin, ShortMax int
	LongMin, LongMax   int
	LongFraction       float64
	// OutputMin..OutputMax is the range of tokens generated (uniform).
	OutputMin, OutputMax int
}

// AgentSpec describes agent-like sessions: each session's prompt starts at
// about First tokens and grows by about Growth tokens a turn (the tool
// results and the model's own output are appended and the whole prompt is
// prefilled again), with about Interval between turns (the tool running and
// the model's answer). Sessions start as a Poisson process.
type AgentSpec struct {
	Seed           uint64
	Sessions       int
	Turns          int
	First, Growth  int
	Interval       time.Duration
	SessionsPerMin float64
	// OutputMin..OutputMax is the range of tokens generated per turn.
	OutputMin, OutputMax int
}

// Mix generates the jobs of spec in arrival order.
func Mix(s MixSpec) ([]Job, error) {
	switch {
	case s.Jobs < 1:
		return nil, fmt.Errorf("mix: %d jobs, want at least 1", s.Jobs)
	case !(s.PerMin > 0):
		return nil, fmt.Errorf("mix: arrival rate %v jobs/min, want > 0", s.PerMin)
	case s.ShortMin < 1 || s.ShortMax < s.ShortMin:
		return nil, fmt.Errorf("mix: short prompts %d..%d tokens, want 1 <= min <= max", s.ShortMin, s.ShortMax)
	case s.LongFraction < 0 || s.LongFraction > 1:
		return nil, fmt.Errorf("mix: long fraction %v, want 0..1", s.LongFraction)
	case s.LongFraction > 0 && (s.LongMin < 1 || s.LongMax < s.LongMin):
		return nil, fmt.Errorf("mix: long prompts %d..%d tokens, want 1 <= min <= max", s.LongMin, s.LongMax)
	case s.OutputMin < 1 || s.OutputMax < s.OutputMin:
		return nil, fmt.Errorf("mix: output %d..%d tokens, want 1 <= min <= max", s.OutputMin, s.OutputMax)
	}
	r := rand.New(rand.NewPCG(s.Seed, 0x6d6978))
	jobs := make([]Job, s.Jobs)
	var t time.Duration
	for i := range jobs {
		if i > 0 {
			t += exponential(r, time.Minute, s.PerMin)
		}
		p := logUniform(r, s.ShortMin, s.ShortMax)
		if r.Float64() < s.LongFraction {
			p = logUniform(r, s.LongMin, s.LongMax)
		}
		jobs[i] = Job{ID: fmt.Sprintf("mix-%03d", i), Arrival: t, Prompt: p, Output: uniform(r, s.OutputMin, s.OutputMax)}
	}
	return jobs, nil
}

// Agent generates the turns of spec's sessions in arrival order.
func Agent(s AgentSpec) ([]Job, error) {
	switch {
	case s.Sessions < 1 || s.Turns < 1:
		return nil, fmt.Errorf("agent: %d sessions of %d turns, want at least 1 of each", s.Sessions, s.Turns)
	case s.First < 1 || s.Growth < 0:
		return nil, fmt.Errorf("agent: first prompt %d tokens, growth %d, want first >= 1 and growth >= 0", s.First, s.Growth)
	case s.Interval <= 0:
		return nil, fmt.Errorf("agent: interval %v between turns, want > 0", s.Interval)
	case !(s.SessionsPerMin > 0):
		return nil, fmt.Errorf("agent: %v sessions/min, want > 0", s.SessionsPerMin)
	case s.OutputMin < 1 || s.OutputMax < s.OutputMin:
		return nil, fmt.Errorf("agent: output %d..%d tokens, want 1 <= min <= max", s.OutputMin, s.OutputMax)
	}
	r := rand.New(rand.NewPCG(s.Seed, 0x6167656e74))
	var jobs []Job
	var start time.Duration
	for k := 0; k < s.Sessions; k++ {
		if k > 0 {
			start += exponential(r, time.Minute, s.SessionsPerMin)
		}
		sess := fmt.Sprintf("agent-%02d", k)
		t := start
		p := jitter(r, s.First)
		for turn := 0; turn < s.Turns; turn++ {
			if turn > 0 {
				t += time.Duration(float64(s.Interval) * (0.5 + r.Float64()))
				p += jitter(r, s.Growth)
			}
			jobs = append(jobs, Job{ID: fmt.Sprintf("%s-t%02d", sess, turn), Arrival: t, Prompt: max(1, p),
				Output: uniform(r, s.OutputMin, s.OutputMax), Session: sess, Turn: turn})
		}
	}
	Sort(jobs)
	return jobs, nil
}

// exponential draws a gap of a Poisson process of rate per unit.
func exponential(r *rand.Rand, unit time.Duration, rate float64) time.Duration {
	return time.Duration(r.ExpFloat64() / rate * float64(unit))
}

// logUniform draws an integer in [lo, hi] with a log-uniform distribution.
func logUniform(r *rand.Rand, lo, hi int) int {
	if hi <= lo {
		return lo
	}
	v := math.Exp(math.Log(float64(lo)) + r.Float64()*(math.Log(float64(hi)+1)-math.Log(float64(lo))))
	return min(hi, max(lo, int(v)))
}

func uniform(r *rand.Rand, lo, hi int) int { return lo + r.IntN(hi-lo+1) }

// jitter draws about n: uniform in [n/2, 3n/2].
func jitter(r *rand.Rand, n int) int {
	if n <= 1 {
		return n
	}
	return n/2 + r.IntN(n+1)
}

// K3Mix is the generated mix of the K3 projection: 80 requests, a quarter
// of them long (16k-200k tokens: documents, code bases), the rest short
// (200-4k: chat turns, tool results), arriving at perMin a minute.
func K3Mix(seed uint64, perMin float64) MixSpec {
	return MixSpec{Seed: seed, Jobs: 80, PerMin: perMin, ShortMin: 200, ShortMax: 4000, LongMin: 16000, LongMax: 200000,
		LongFraction: 0.25, OutputMin: 16, OutputMax: 256}
}

// K3Agent is the agent-session workload of the K3 projection: 10 sessions
// of 10 turns starting at sessionsPerMin a minute, prompts from about 1.5k
// tokens growing about 1.5k a turn, turns about 90 s apart.
func K3Agent(seed uint64, sessionsPerMin float64) AgentSpec {
	return AgentSpec{Seed: seed, Sessions: 10, Turns: 10, First: 1500, Growth: 1500, Interval: 90 * time.Second,
		SessionsPerMin: sessionsPerMin, OutputMin: 32, OutputMax: 256}
}

// LocalMix is the generated mix for a small synthetic model on one machine
// (bench e2e, and bench sim with the calibrated profile): 24 requests, a
// quarter long (512-2048 tokens), the rest short (16-256), 4-16 tokens
// generated each.
func LocalMix(seed uint64, perMin float64) MixSpec {
	return MixSpec{Seed: seed, Jobs: 24, PerMin: perMin, ShortMin: 16, ShortMax: 256, LongMin: 512, LongMax: 2048,
		LongFraction: 0.25, OutputMin: 4, OutputMax: 16}
}

// LocalAgent is the agent-session workload at the scale of LocalMix: 4
// sessions of 6 turns, prompts from about 128 tokens growing about 128 a
// turn, turns about 3 s apart.
func LocalAgent(seed uint64, sessionsPerMin float64) AgentSpec {
	return AgentSpec{Seed: seed, Sessions: 4, Turns: 6, First: 128, Growth: 128, Interval: 3 * time.Second,
		SessionsPerMin: sessionsPerMin, OutputMin: 4, OutputMax: 16}
}
