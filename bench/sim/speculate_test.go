package sim

import (
	"math"
	"testing"
)

// K3's step reads follow from its released shapes: 2.78 T parameters of
// which the routed experts are nearly all; a one-row step reads the
// active part (about 104 B parameters' worth, MXFP4 experts).
func TestK3StepRead(t *testing.T) {
	m := k3(t)
	r := NewStepRead(m)
	if r.Experts != m.Cfg.NumExperts || r.TopK != m.Cfg.TopK || r.MoELayers != m.Cfg.NumLayers-1 {
		t.Fatalf("step read %+v does not follow the config (experts %d, top-k %d, layers %d)", r, m.Cfg.NumExperts, m.Cfg.TopK, m.Cfg.NumLayers)
	}
	all := float64(r.Fixed) + float64(r.MoELayers*r.Experts)*float64(r.Expert)
	if all < 1.3e12 || all > 1.7e12 {
		t.Errorf("all weights but the embedding: %.3g bytes; K3 is about 1.56 TB", all)
	}
	one := r.Bytes(1)
	if one >= all/10 {
		t.Errorf("a one-row step reads %.3g of %.3g bytes: it should read only the active part", one, all)
	}
	// Each extra row adds experts, never more than its own top-k.
	for rows := 1; rows < 8; rows++ {
		d := r.Bytes(rows+1) - r.Bytes(rows)
		if d <= 0 || d > float64(r.MoELayers*r.TopK)*float64(r.Expert)+1 {
			t.Errorf("row %d adds %.3g bytes", rows+1, d)
		}
	}
	// With every expert picked the read is everything.
	if got := r.Bytes(1 << 20); math.Abs(got-all)/all > 1e-6 {
		t.Errorf("a step that picks every expert reads %.4g, want %.4g", got, all)
	}
}

// The projection applies the group's own rule: no drafting at zero
// acceptance, more tokens per step and a higher rate as acceptance grows.
func TestProjectSpec(t *testing.T) {
	s := k3Setup(t, "")
	ps := ProjectSpec(s.Model, s.Decode, []float64{0, 0.5, 0.7, 0.9}, 4)
	if ps[0].K != 0 || math.Abs(ps[0].Speedup-1) > 1e-9 {
		t.Errorf("at acceptance 0: %+v, want no drafting and speedup 1", ps[0])
	}
	base := 1 / (s.Decode.DecodeStepMS / 1e3)
	if math.Abs(ps[0].TokPerS-base) > 1e-9 {
		t.Errorf("plain decoding projects %.3f tok/s, the profile's step gives %.3f", ps[0].TokPerS, base)
	}
	for i := 1; i < len(ps); i++ {
		if ps[i].TokPerS < ps[i-1].TokPerS || ps[i].Speedup < 1 {
			t.Errorf("acceptance %.1f: %+v after %+v", ps[i].Acceptance, ps[i], ps[i-1])
		}
	}
	for _, p := range ps {
		t.Logf("acceptance %.1f: k=%d, %.2f tokens a step of %.1f ms, %.1f tok/s, %.2fx", p.Acceptance, p.K, p.TokensPerStep, p.StepMS, p.TokPerS, p.Speedup)
	}
	if hi := ps[len(ps)-1]; hi.K < 2 || hi.Speedup <= 1.5 {
		t.Errorf("at acceptance 0.9 the rule drafts k=%d for %.2fx: the verify rows are too dear", hi.K, hi.Speedup)
	}
}
