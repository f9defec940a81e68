package planner

import (
	"errors"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/model"
)

func k3(t *testing.T) (*model.Config, Costs, DeviceLayer) {
	t.Helper()
	raw, err := configs.ModelPreset("k3")
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	const layer = 17_000_000_000 // K3's largest layer, about 17 GB
	co := ModelCosts(c, model.BF16, layer, 2*int64(c.HiddenSize), 1)
	return c, co, ConfigLayer(c, layer)
}

const gb = int64(1) << 30

func TestDevicePlanK3(t *testing.T) {
	c, co, l := k3(t)
	// One routed expert as released: 3 matrices of 3072x3584 MXFP4 (4.25 bits).
	if want := int64(3*3072*3584) * 17 / 32; l.Expert != want || l.Experts != c.NumExperts {
		t.Fatalf("expert %d bytes x %d, want %d x %d", l.Expert, l.Experts, want, c.NumExperts)
	}
	if l.Attn <= 0 || l.Attn > 2*gb {
		t.Fatalf("attention block %d bytes", l.Attn)
	}

	// RTX 5090 (32 GB): two 17 GB layers do not fit, so layers stream in parts.
	p, err := PlanDevice(DeviceInput{Device: 30 * gb, Layer: l, Costs: co, Tokens: 8192, Tile: 2048, Seqs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != LayerParts || p.Parts < 3 || p.Total > p.Device {
		t.Fatalf("5090: %+v", p)
	}
	room := p.Device - p.Working
	grp := int64(p.GroupExperts) * l.Expert
	if l.Attn+grp > room || 2*grp > room {
		t.Errorf("5090: two consecutive parts (%d, %d) exceed the room %d", l.Attn+grp, 2*grp, room)
	}
	// The group is the largest that fits: one more expert would not.
	if more := grp + l.Expert; l.Attn+more <= room && 2*more <= room {
		t.Errorf("5090: groups of %d experts; %d would fit", p.GroupExperts, p.GroupExperts+1)
	}
	if p.Parts != 1+(l.Experts+p.GroupExperts-1)/p.GroupExperts {
		t.Errorf("5090: %d parts for groups of %d", p.Parts, p.GroupExperts)
	}

	// H200 (141 GB): whole layers, double-buffered.
	p, err = PlanDevice(DeviceInput{Device: 135 * gb, Layer: l, Costs: co, Tokens: 8192, Tile: 2048, Seqs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != WholeLayers || p.Weights != 2*l.Bytes() || p.Total > p.Device {
		t.Fatalf("H200: %+v", p)
	}
}

func TestDevicePlanTooSmall(t *testing.T) {
	_, co, l := k3(t)
	// Not even the attention block and one expert.
	_, err := PlanDevice(DeviceInput{Device: l.Attn, Layer: l, Costs: co, Tokens: 64, Tile: 64, Seqs: 1})
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "attention block") || !strings.Contains(err.Error(), "one expert") {
		t.Errorf("err = %v", err)
	}
	// A pass whose activations alone exceed the device.
	_, err = PlanDevice(DeviceInput{Device: 8 * gb, Layer: l, Costs: co, Tokens: 4 << 20, Tile: 2048, Seqs: 1})
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "activations") || !strings.Contains(err.Error(), "4194304 tokens") {
		t.Errorf("err = %v", err)
	}
	if _, err := PlanDevice(DeviceInput{Layer: l, Costs: co, Tokens: 1, Tile: 1, Seqs: 1}); err == nil {
		t.Error("a zero device was planned")
	}
}

// A layer that exactly fits twice is double-buffered; one byte less streams
// as the attention block and one group of every expert (half the weights).
func TestDevicePlanBoundary(t *testing.T) {
	_, co, _ := k3(t)
	l := DeviceLayer{Attn: 100 << 20, Expert: 10 << 20, Experts: 10}
	in := DeviceInput{Layer: l, Costs: co, Tokens: 64, Tile: 64, Seqs: 1}
	probe, err := PlanDevice(DeviceInput{Device: 1 << 40, Layer: l, Costs: co, Tokens: 64, Tile: 64, Seqs: 1})
	if err != nil {
		t.Fatal(err)
	}
	in.Device = probe.Working + 2*l.Bytes()
	if p, err := PlanDevice(in); err != nil || p.Mode != WholeLayers || p.Total != in.Device {
		t.Fatalf("exact fit: %+v %v", p, err)
	}
	in.Device--
	p, err := PlanDevice(in)
	if err != nil || p.Mode != LayerParts || p.GroupExperts != 10 || p.Parts != 2 || p.Weights != l.Bytes() || p.Total > in.Device {
		t.Fatalf("one byte short: %+v %v", p, err)
	}
}
