package sim

import (
	"context"
	"fmt"
	"testing"

	"github.com/tandem-inference/tandem/bench/workload"
	"github.com/tandem-inference/tandem/coordinator/router"
)

func p50(t *testing.T, s Setup, jobs []workload.Job, p router.Policy) float64 {
	t.Helper()
	r, err := Run(context.Background(), s, jobs, Options{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	sum := Summarize(r)
	if sum.Refused > 0 {
		t.Fatalf("%s: %d jobs refused", p, sum.Refused)
	}
	return sum.TTFTP50
}

// TestAutoIsNeverMuchWorseThanTheBetterFixedPolicy: on the generated mix,
// from light to heavy load, auto's TTFT p50 is within 5% of the better of
// local and remote (it is usually well below both: short prompts stay on the
// Macs, long ones go to the GPU box).
func TestAutoIsNeverMuchWorseThanTheBetterFixedPolicy(t *testing.T) {
	for _, box := range []string{"rtx5090", "h200"} {
		s := k3Setup(t, box)
		for seed := uint64(1); seed <= 3; seed++ {
			for _, rate := range []float64{0.25, 1, 4} {
				jobs, err := workload.Mix(workload.K3Mix(seed, rate))
				if err != nil {
					t.Fatal(err)
				}
				name := fmt.Sprintf("%s seed %d, %v jobs/min", box, seed, rate)
				l, r, a := p50(t, s, jobs, router.Local), p50(t, s, jobs, router.Remote), p50(t, s, jobs, router.Auto)
				if a > 1.05*min(l, r) {
					t.Errorf("%s: auto p50 %.1fs, local %.1fs, remote %.1fs", name, a, l, r)
				} else {
					t.Logf("%s: auto p50 %.1fs, local %.1fs, remote %.1fs", name, a, l, r)
				}
			}
		}
	}
}

// TestAutoBeatsAFixedThresholdOnAgentSessions: growing agent prompts of 1.5k
// to ~15k tokens; a 1,000-token threshold sends every turn through a ~29 s
// pass, auto keeps turns below the break-even on the Macs.
func TestAutoBeatsAFixedThresholdOnAgentSessions(t *testing.T) {
	s := k3Setup(t, "rtx5090")
	for seed := uint64(1); seed <= 3; seed++ {
		for _, spm := range []float64{0.5, 2} {
			jobs, err := workload.Agent(workload.K3Agent(seed, spm))
			if err != nil {
				t.Fatal(err)
			}
			a, th := p50(t, s, jobs, router.Auto), p50(t, s, jobs, router.Threshold)
			if a >= th {
				t.Errorf("seed %d, %v sessions/min: auto p50 %.1fs is not below the 1k threshold's %.1fs", seed, spm, a, th)
			} else {
				t.Logf("seed %d, %v sessions/min: auto p50 %.1fs, 1k threshold %.1fs", seed, spm, a, th)
			}
		}
	}
}
