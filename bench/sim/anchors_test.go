package sim

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tandem-inference/tandem/coordinator/router"
	"github.com/tandem-inference/tandem/model/synth"
)

// The published K3 arithmetic (docs/HARDWARE.md, from K3's released config) that the
// projection must reproduce from the profiles in configs/hardware.

var (
	k3Once  sync.Once
	k3Model *Model
	k3Err   error
)

func k3(t *testing.T) *Model {
	t.Helper()
	k3Once.Do(func() { k3Model, k3Err = LoadModel("k3") })
	if k3Err != nil {
		t.Fatal(k3Err)
	}
	return k3Model
}

// k3Setup is a GPU box (or none) with the four Macs over 10 GbE.
func k3Setup(t *testing.T, prefill string) Setup {
	t.Helper()
	load := func(n string) *Profile {
		p, err := LoadProfile(n)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	var pre *Profile
	if prefill != "" {
		pre = load(prefill)
	}
	s, err := NewSetup(k3(t), pre, load("m3ultra-x4"), load("10gbe"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func idle(t *testing.T, s Setup, p router.Policy, n int) JobResult {
	t.Helper()
	j, err := Idle(context.Background(), s, p, n)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func between(t *testing.T, what string, v, lo, hi float64) {
	t.Helper()
	if v < lo || v > hi {
		t.Errorf("%s = %.4g, want %.4g..%.4g", what, v, lo, hi)
	} else {
		t.Logf("%s = %.4g (anchor %.4g..%.4g)", what, v, lo, hi)
	}
}

func TestK3SizesMatchTheRelease(t *testing.T) {
	m := k3(t)
	// K3-SPEC §5.1: metadata.total_size of the released index. The text
	// tower's layers and globals are all of it but the vision tower and
	// projector (< 0.1%).
	const totalSize = 1_560_860_324_864
	var globals int64
	for _, x := range synth.Plan(m.Cfg).Globals {
		globals += x.Bytes()
	}
	between(t, "text tower bytes / released total_size", float64(m.ReadBytes+globals)/totalSize, 0.999, 1.0)
	// 104 B active parameters: 2 FLOP each per token, besides attention.
	between(t, "linear GFLOP per token", PromptFLOPs(m.Cfg, 0, 1).Total()/1e9, 2*100, 2*106)
	// ~1.2e17 FLOP for a 300k prompt (62 PFLOP linear, 53 attention by the
	// anchor's count; this package counts q·k at 192 and v at 128 wide).
	between(t, "300k-token prefill PFLOP", PromptFLOPs(m.Cfg, 0, 300000).Total()/1e15, 110, 135)
	// K3-SPEC §4: 27,648 B/token of latent rows and 434 MB of KDA state
	// (plus fp32 conv tails).
	sh := m.Cost.Shape
	if sh.StateBytesPerToken != 27648 || sh.LastLayerBytesPerToken != 1152 || m.StateBytes(0) != 434110464+69*3*12288*3*4 {
		t.Fatalf("state shape %+v, fixed %d", sh, m.StateBytes(0))
	}
}

func TestK3PassFloorAtPCIe5(t *testing.T) {
	for _, box := range []string{"rtx5090", "h200"} {
		s := k3Setup(t, box)
		between(t, box+" pass floor (s)", PassFloor(s).Seconds(), 25, 31)
		// A short prompt's remote TTFT is the floor: one pass of reads.
		j := idle(t, s, router.Remote, 1000)
		between(t, box+" 1k-token remote TTFT / floor", j.TTFT.Seconds()/PassFloor(s).Seconds(), 1, 1.02)
	}
}

func TestK3TTFTAt300kTokens(t *testing.T) {
	r5090 := idle(t, k3Setup(t, "rtx5090"), router.Remote, 300000)
	between(t, "rtx5090 300k TTFT (min)", r5090.TTFT.Minutes(), 4.5, 11)
	h200 := idle(t, k3Setup(t, "h200"), router.Remote, 300000)
	between(t, "h200 300k TTFT (min)", h200.TTFT.Minutes(), 1.5, 2.2)
	// About an hour on the Macs (~67 min at ~75 tok/s for 2 x M3 Ultra).
	macs := idle(t, k3Setup(t, ""), router.Local, 300000)
	between(t, "macs 300k TTFT (min)", macs.TTFT.Minutes(), 50, 85)
	// The state streams during the pass: 27,648 B/token of latent rows
	// (8.29 GB for 300k tokens; the published figures round it to 7.4-7.8) plus 434 MB of KDA state and 30 MB of fp32 conv tails. Only the
	// last layer's 346 MB is left after the pass: ~0.3 s at 10 GbE.
	for _, j := range []JobResult{r5090, h200} {
		if want := k3(t).StateBytes(299999); j.Bytes != want {
			t.Errorf("300k prompt moved %d bytes, want its state %d", j.Bytes, want)
		}
		between(t, "300k exposed tail (s)", j.TransferTail.Seconds(), 0.29, 0.32)
	}
}

func TestK3FloorDominatesShortPrompts(t *testing.T) {
	// Below ~35-80k tokens (5090) or ~110k (H200) the pass floor
	// dominates: TTFT is ~28-31 s flat.
	for _, c := range []struct {
		box       string
		flat, not int
	}{{"rtx5090", 30000, 80000}, {"h200", 100000, 150000}} {
		s := k3Setup(t, c.box)
		floor := PassFloor(s)
		if j := idle(t, s, router.Remote, c.flat); j.TTFT > floor+time.Second {
			t.Errorf("%s: %d tokens take %v, want the floor %v", c.box, c.flat, j.TTFT, floor)
		}
		if j := idle(t, s, router.Remote, c.not); j.TTFT < floor+10*time.Second {
			t.Errorf("%s: %d tokens take %v, want compute to show above the floor %v", c.box, c.not, j.TTFT, floor)
		}
	}
}

func TestK3BreakEven(t *testing.T) {
	// Break-even at roughly 3k uncached tokens (1.5-5k). With the fastest
	// published Mac prefill rates (158 tok/s at 8K, configs/hardware/
	// m3ultra-x4.yaml) it lands near the top of the range; at the 60 tok/s
	// reported for 4 x M3 Ultra in MXFP4 it would be ~1.8k.
	for _, box := range []string{"rtx5090", "h200"} {
		s := k3Setup(t, box)
		n, err := BreakEven(context.Background(), s, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		between(t, box+" break-even tokens", float64(n), 1500, 5000)
		// The router's own model, seeded from the same profiles, agrees.
		rn := router.BreakEven(s.Model.Cost, SeedRates(s, 8192), 1<<20)
		between(t, box+" router break-even / simulated", float64(rn)/float64(n), 0.95, 1.05)
	}
}
