package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/model"
)

func TestEmbeddedProfilesParse(t *testing.T) {
	names := configs.HardwareProfiles()
	for _, want := range []string{"rtx5090", "h200", "m3ultra-x4", "10gbe", "100gbe", "tb5-rdma"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("no hardware profile %s (have %v)", want, names)
		}
	}
	for _, n := range names {
		p, err := LoadProfile(n)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		if p.Name != n {
			t.Errorf("profile %s calls itself %q", n, p.Name)
		}
	}
}

func TestProfileErrorsSayWhatAndWhere(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"", "empty"},
		{"name: x\n", "no prefill, decode or link section"},
		{"link:\n  gb_per_s: 1\n  rtt: 3\n", `line 3: unknown key "rtt" (valid keys here: gb_per_s, per_rank, rtt_us)`},
		{"prefill:\n  memory_budgt: 1GB\n", `line 2: unknown key "memory_budgt" (did you mean memory_budget?)`},
		{"decode:\n  rank: 2\n", `line 2: unknown key "rank" (did you mean ranks?)`},
		{"link:\n  gb_per_s: -1\n", "link: gb_per_s is -1"},
		{"decode:\n  ranks: 2\n  decode_step_ms: 40\n", "prefill_rate or compute_gflops is missing"},
		{"decode:\n  ranks: 2\n  decode_step_ms: 40\n  prefill_rate: [{tokens: 0, tok_per_s: 3}]\n", "prefill_rate[0].tokens is 0"},
		{"prefill:\n  disk_read_gb_per_s: 5\n  compute_gflops: {kda: 1, mla: 1, moe: 1, dense: 1}\n", "memory_budget is missing"},
		{"prefill:\n  disk_read_gb_per_s: 5\n  memory_budget: 1GB\n  compute_gflops: {kda: 1, mla: 0, moe: 1, dense: 1}\n", "compute_gflops.mla is 0"},
		{"prefill:\n  disk_read_gb_per_s: 5\n  memory_budget: lots\n  compute_gflops: {kda: 1, mla: 1, moe: 1, dense: 1}\n", "memory_budget: \"lots\" is not a byte size, which is a number with an optional unit"},
	} {
		_, err := ParseProfile([]byte(c.yaml), "test.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "test.yaml") {
			t.Errorf("%q: error %v, want one naming test.yaml and saying %q", c.yaml, err, c.want)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "mine.yaml")
	if err := os.WriteFile(path, []byte("link:\n  gb_per_s: 2.5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := LoadProfile(path)
	if err != nil || p.Link.GBps != 2.5 || p.Name != path {
		t.Fatalf("profile from a file: %+v, %v", p, err)
	}
	if _, err := LoadProfile("no-such-box"); err == nil || !strings.Contains(err.Error(), "rtx5090") {
		t.Fatalf("unknown profile: %v, want the list of known ones", err)
	}
}

func TestLayerFLOPsCounts(t *testing.T) {
	c := k3(t).Cfg
	// MLA attention: a prefix of the prompt and the rest add up to the
	// whole (the pairs are counted by position, not by piece).
	L := c.MLALayers[0]
	whole := LayerFLOPs(c, L, 0, 1000)
	parts := LayerFLOPs(c, L, 0, 640).Add(LayerFLOPs(c, L, 640, 1000))
	if d := whole.Attn - parts.Attn; d > 1 || d < -1 || whole.MLA != parts.MLA {
		t.Fatalf("MLA over [0,1000) %+v, pieces %+v", whole, parts)
	}
	// Attention grows with the context: the second half costs about three
	// times the first (pairs 125k against 375k); projections are linear.
	a, b := LayerFLOPs(c, L, 0, 500), LayerFLOPs(c, L, 500, 1000)
	if r := b.Attn / a.Attn; r < 2.9 || r > 3.1 || a.MLA != b.MLA {
		t.Fatalf("later positions cost %+v, earlier %+v", b, a)
	}
	// KDA and the feed-forward are linear in the tokens.
	K := c.KDALayers[0]
	if a, b := LayerFLOPs(c, K, 0, 100), LayerFLOPs(c, K, 5000, 5200); b.KDA != 2*a.KDA || b.MoE != 2*a.MoE {
		t.Fatalf("KDA layer over 100 tokens %+v, over 200 %+v", a, b)
	}
	if f := LayerFLOPs(c, 0, 0, 1); f.Dense == 0 || f.MoE != 0 || !c.IsDense(0) {
		t.Fatalf("layer 0 is the dense one: %+v", f)
	}
	if f := LayerFLOPs(c, 1, 7, 7); f.Total() != 0 {
		t.Fatalf("no tokens, no work: %+v", f)
	}
	if c.LayerKind(K) != model.KDA {
		t.Fatal("layer list")
	}
}

func TestControlPlaneSectionIsReadWithTheDecodeGroup(t *testing.T) {
	p, err := ParseProfile([]byte("name: x\ndecode:\n  ranks: 2\n  prefill_rate: [{tokens: 100, tok_per_s: 50}]\n  decode_step_ms: 5\ncontrol_plane:\n  local_ms: 2\n  remote_ms: 6\n"), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := LoadModel("tiny")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSetup(m, nil, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Control == nil || s.Control.LocalMS != 2 || s.Control.RemoteMS != 6 {
		t.Fatalf("control plane %+v", s.Control)
	}
	_, err = ParseProfile([]byte("name: x\ndecode:\n  ranks: 2\n  prefill_rate: [{tokens: 100, tok_per_s: 50}]\n  decode_step_ms: 5\ncontrol_plane:\n  remote_ms: -1\n"), "x.yaml")
	if err == nil || !strings.Contains(err.Error(), "control_plane: remote_ms") {
		t.Fatalf("negative latency: %v", err)
	}
}
