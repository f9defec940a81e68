package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/tandem-inference/tandem/bench/workload"
	"github.com/tandem-inference/tandem/coordinator/router"
)

// NewSetup assembles a setup from profiles: the decode group of decode
// (with its profile's control-plane latency, if it has one), and, when
// prefill is not nil, its prefill box with link's link. Its name is
// "decode" alone or "prefill+decode/link".
func NewSetup(m *Model, prefill, decode, link *Profile) (Setup, error) {
	if decode == nil || decode.Decode == nil {
		return Setup{}, fmt.Errorf("sim: the decode profile has no decode section")
	}
	s := Setup{Name: decode.Name, Model: m, Decode: decode.Decode, Control: decode.ControlPlane}
	if prefill != nil {
		if prefill.Prefill == nil {
			return Setup{}, fmt.Errorf("sim: profile %s has no prefill section", prefill.Name)
		}
		if link == nil || link.Link == nil {
			return Setup{}, fmt.Errorf("sim: a prefill box needs a link profile with a link section")
		}
		s.Prefill, s.Link = prefill.Prefill, link.Link
		s.Name = prefill.Name + "+" + decode.Name + "/" + link.Name
	}
	return s, s.Validate()
}

// PassFloor is a weight pass's read time on the setup's prefill box: the
// least a pass can take.
func PassFloor(s Setup) time.Duration {
	var d time.Duration
	if s.Prefill != nil {
		for _, r := range readTimes(s) {
			d += r
		}
	}
	return d
}

// Idle simulates one job of prompt tokens (one output token) alone on the
// setup under policy.
func Idle(ctx context.Context, s Setup, policy router.Policy, prompt int) (JobResult, error) {
	r, err := Run(ctx, s, []workload.Job{{ID: "idle", Prompt: prompt, Output: 1}}, Options{Policy: policy})
	if err != nil {
		return JobResult{}, err
	}
	j := r.Jobs[0]
	if j.Refused != "" {
		return j, fmt.Errorf("sim: %s: a prompt of %d tokens was refused: %s", s.Name, prompt, j.Refused)
	}
	return j, nil
}

// BreakEven is the shortest prompt of at most maxPrompt tokens whose
// simulated TTFT on the idle setup is lower remote than local (0 when
// remote never wins, or the setup has no prefill box). Remote's advantage
// grows with the prompt, so it bisects.
func BreakEven(ctx context.Context, s Setup, maxPrompt int) (int, error) {
	if s.Prefill == nil {
		return 0, nil
	}
	better := func(n int) (bool, error) {
		r, err := Idle(ctx, s, router.Remote, n)
		if err != nil {
			return false, err
		}
		l, err := Idle(ctx, s, router.Local, n)
		if err != nil {
			return false, err
		}
		return r.TTFT < l.TTFT, nil
	}
	ok, err := better(maxPrompt)
	if err != nil || !ok {
		return 0, err
	}
	lo, hi := 1, maxPrompt
	for lo < hi {
		mid := lo + (hi-lo)/2
		ok, err := better(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, nil
}
