package sim

import (
	"math"
	"slices"
	"time"

	"github.com/tandem-inference/tandem/coordinator/router"
)

// Summary is a run's figures per policy, as bench sim and bench e2e report
// them (JSON keys are part of their output).
type Summary struct {
	Policy    string `json:"policy"`
	Jobs      int    `json:"jobs"`
	Completed int    `json:"completed"`
	Refused   int    `json:"refused"`
	Remote    int    `json:"remote"`
	Local     int    `json:"local"`
	// TTFT percentiles and mean over completed jobs, in seconds.
	TTFTP50  float64 `json:"ttft_p50_s"`
	TTFTP95  float64 `json:"ttft_p95_s"`
	TTFTP99  float64 `json:"ttft_p99_s"`
	TTFTMean float64 `json:"ttft_mean_s"`
	// JobsPerMin is completed jobs over the time from the first arrival to
	// the last token.
	JobsPerMin float64 `json:"jobs_per_min"`
	// Passes and JobsPerPass describe pass batching (jobs sharing a pass).
	Passes      int     `json:"passes"`
	JobsPerPass float64 `json:"jobs_per_pass"`
	// BytesMoved is the state sent over the link.
	BytesMoved int64 `json:"bytes_moved"`
	// ExposedTail is the state still in flight after a remote job's last
	// pass, in seconds.
	ExposedTailP50  float64 `json:"exposed_tail_p50_s"`
	ExposedTailMax  float64 `json:"exposed_tail_max_s"`
	ExposedTailMean float64 `json:"exposed_tail_mean_s"`
	// DecodeTokPerS is a job's decode rate after its first token, over
	// every job with more than one output token together: the tokens after
	// the first over the time they took (a mean of per-job rates would be
	// ruled by the shortest jobs, whose few tokens can arrive at once).
	DecodeTokPerS float64 `json:"decode_tok_per_s"`
	// Mean time breakdown of completed jobs, in seconds.
	QueueMean     float64 `json:"queue_mean_s"`
	PrefillMean   float64 `json:"prefill_mean_s"`
	FirstStepMean float64 `json:"first_step_mean_s"`
}

// Summarize computes a run's summary.
func Summarize(r *Result) Summary {
	s := Summary{Policy: string(r.Policy), Jobs: len(r.Jobs), Passes: len(r.Passes)}
	var ttft, tails []float64
	var decode float64
	var decodeT float64
	first := time.Duration(math.MaxInt64)
	for _, j := range r.Jobs {
		first = min(first, j.Arrival)
		if j.Refused != "" {
			s.Refused++
			continue
		}
		s.Completed++
		if j.Target == router.TargetRemote {
			s.Remote++
			tails = append(tails, j.TransferTail.Seconds())
		} else {
			s.Local++
		}
		ttft = append(ttft, j.TTFT.Seconds())
		s.BytesMoved += j.Bytes
		s.QueueMean += j.Queue.Seconds()
		s.PrefillMean += j.Prefill.Seconds()
		s.FirstStepMean += j.FirstStep.Seconds()
		if j.Output > 1 && j.Done > j.FirstToken {
			decode += float64(j.Output - 1)
			decodeT += (j.Done - j.FirstToken).Seconds()
		}
	}
	if s.Completed > 0 {
		n := float64(s.Completed)
		s.QueueMean /= n
		s.PrefillMean /= n
		s.FirstStepMean /= n
		if span := r.End - first; span > 0 {
			s.JobsPerMin = n / span.Minutes()
		}
	}
	s.TTFTP50, s.TTFTP95, s.TTFTP99 = Percentile(ttft, 50), Percentile(ttft, 95), Percentile(ttft, 99)
	s.TTFTMean = mean(ttft)
	s.ExposedTailP50, s.ExposedTailMean = Percentile(tails, 50), mean(tails)
	if len(tails) > 0 {
		s.ExposedTailMax = slices.Max(tails)
	}
	if decodeT > 0 {
		s.DecodeTokPerS = decode / decodeT
	}
	var jobs int
	for _, p := range r.Passes {
		jobs += p.Jobs
	}
	if len(r.Passes) > 0 {
		s.JobsPerPass = float64(jobs) / float64(len(r.Passes))
	}
	return s
}

// Percentile is the p-th percentile of xs by linear interpolation between
// closest ranks (0 for no values).
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	pos := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var t float64
	for _, x := range xs {
		t += x
	}
	return t / float64(len(xs))
}
