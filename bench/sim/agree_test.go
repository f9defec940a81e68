package sim

import (
	"testing"

	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/costmodel"
)

// TestRouterAndSimulatorAgree drives the router and the simulator through
// the same cost model (package costmodel) and checks they agree: for one
// prompt on an idle cluster, on each path, the router's prediction from
// the setup's seed rates against the simulator's TTFT, which times every
// pass layer by layer (reads, prefetch, compute per layer, each layer's
// state on the link) and the group's prefill step by step. At K3 scale
// from 1k to 300k tokens, and on this machine's profile with the small
// preset from 64 to 16k tokens, where the attention's square decides.
func TestRouterAndSimulatorAgree(t *testing.T) {
	small, err := LoadModel("small")
	if err != nil {
		t.Fatal(err)
	}
	local, err := LoadProfile("local")
	if err != nil {
		t.Fatal(err)
	}
	here, err := NewSetup(small, local, local, local)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		s       Setup
		prompts []int
	}{
		{k3Setup(t, "rtx5090"), []int{1000, 10000, 100000, 300000}},
		{k3Setup(t, "h200"), []int{1000, 10000, 100000, 300000}},
		{here, []int{64, 256, 1024, 4096, 16384}},
	} {
		r := SeedRates(c.s, 8192)
		for _, n := range c.prompts {
			d := router.Route(router.Auto, c.s.Model.Cost, r, router.Load{PrefillUp: true, LocalChunk: chunkOf(c.s.Decode)}, n)
			for _, p := range []struct {
				policy router.Policy
				pred   costmodel.Prediction
			}{{router.Local, d.Local}, {router.Remote, d.Remote}} {
				if c.s.Name != here.Name && p.policy == router.Local && n > 100000 {
					continue // hours on the Macs: the same sum, slowly simulated
				}
				j := idle(t, c.s, p.policy, n)
				ratio := p.pred.Total.Seconds() / j.TTFT.Seconds()
				t.Logf("%s %s %d tokens: router %v, simulated %v (%.3f)", c.s.Name, p.policy, n, p.pred.Total, j.TTFT, ratio)
				if ratio < 0.98 || ratio > 1.02 {
					t.Errorf("%s %s %d tokens: router predicts %v, the simulator gives %v (ratio %.3f)", c.s.Name, p.policy, n, p.pred.Total, j.TTFT, ratio)
				}
			}
		}
	}
}
