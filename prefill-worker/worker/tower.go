package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/vision"
)

// residentTower is the checkpoint's vision tower, loaded at start on the
// worker's backend and kept for the worker's life: every image job of a
// remote prefill runs it once, before its first pass.
type residentTower struct {
	t     *vision.Tower
	bytes int64 // its weights as stored, counted in the memory budget
}

// loadTower loads the vision tower of cfg.Model, or returns nil when the
// checkpoint has none (the worker then refuses image jobs).
func loadTower(cfg Config, be kernels.Backend) (*residentTower, error) {
	t, err := vision.Load(context.Background(), be, cfg.Model)
	if errors.Is(err, vision.ErrNoVisionTower) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("worker: vision tower: %w", err)
	}
	n, err := imagejob.WeightBytes(cfg.Model)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("worker: vision tower: %w", err)
	}
	return &residentTower{t: t, bytes: n}, nil
}

// features is the tower as the image encoder takes it (nil: none).
func (r *residentTower) features() imagejob.Tower {
	if r == nil {
		return nil
	}
	return r.t
}

func (r *residentTower) size() int64 {
	if r == nil {
		return 0
	}
	return r.bytes
}

func (r *residentTower) close() {
	if r != nil {
		r.t.Close()
	}
}

// Images is the worker's image encoder: it decodes a job's images, checks
// them against the prompt's pad runs and runs the tower (refusing image
// jobs when the checkpoint has no tower).
func (w *Worker) Images() *imagejob.Encoder { return w.images }

// isDevice tells a backend with memory of its own (a GPU): its ops must not
// be issued from two goroutines at once, so the tower runs between passes.
func isDevice(be kernels.Backend) bool {
	_, ok := be.(kernels.DeviceMemory)
	return ok
}
