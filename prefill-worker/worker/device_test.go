package worker

import (
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/configs"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/prefill-worker/planner"
)

type fakeDevice struct{ free, total int64 }

func (f fakeDevice) DeviceMemory() (int64, int64) { return f.free, f.total }

// planDevice on K3's sizes: an H200 double-buffers whole layers; a 32 GB
// card plans layer parts and runs, since one layer and the working set fit
// the executor's one-layer-at-a-time binding; a 24 GB card would need the
// parts streamed, which the executor does not do yet (refused with the
// reason); a card too small for the attention block and one expert is
// refused for that.
func TestPlanDeviceK3(t *testing.T) {
	raw, err := configs.ModelPreset("k3")
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	const layer, gb = int64(17_000_000_000), int64(1) << 30
	costs := planner.ModelCosts(c, model.BF16, layer, 2*int64(c.HiddenSize), 1)
	log := zap.NewNop()
	if err := planDevice(fakeDevice{140 * gb, 141 * gb}, "h200", c, layer, costs, 2048, log); err != nil {
		t.Errorf("H200: %v", err)
	}
	if err := planDevice(fakeDevice{31 * gb, 32 * gb}, "rtx5090", c, layer, costs, 2048, log); err != nil {
		t.Errorf("5090: %v", err)
	}
	err = planDevice(fakeDevice{23 * gb, 24 * gb}, "24gb", c, layer, costs, 2048, log)
	if !errors.Is(err, planner.ErrBudget) || !strings.Contains(err.Error(), "parts") || !strings.Contains(err.Error(), "24gb") {
		t.Errorf("24 GB: %v", err)
	}
	err = planDevice(fakeDevice{1 * gb, 2 * gb}, "small", c, layer, costs, 64, log)
	if !errors.Is(err, planner.ErrBudget) || !strings.Contains(err.Error(), "attention block") {
		t.Errorf("small: %v", err)
	}
}
