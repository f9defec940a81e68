package rank

import (
	"fmt"
	"path/filepath"

	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/model"
)

// PinRefused is what to log with Loaded.PinErr: the consequence and the fix.
const PinRefused = "the decode rank's weights may be paged out under memory pressure (raise the memory-lock limit, ulimit -l, to keep them resident)"

// LoadShard loads rank r's resident share of the checkpoint in dir: its
// stage's layer range (only its tensor rank's slices of it), plus the
// embedding on the first stage and the final mix, norm and lm_head (its
// vocabulary range) on the last stage. It checks the layout against the checkpoint's
// config first, so a layout for another model fails before any mapping.
// On a host backend the share is pinned in memory, model.LoadOptions.Pin,
// since a routed expert paged out between the steps that touch it would be
// read from disk while a step waits; Loaded.PinErr says when the system
// refused the lock.
func LoadShard(dir string, be kernels.Backend, l *Layout, r int, latentEps float64) (*model.Loaded, error) {
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	if err := l.Validate(cfg.NumLayers); err != nil {
		return nil, err
	}
	if err := l.CheckModel(cfg); err != nil {
		return nil, err
	}
	if r < 0 || r > l.Last() {
		return nil, fmt.Errorf("rank %d is not in decode group %q (ranks 0..%d)", r, l.Group, l.Last())
	}
	s := l.Ranks[r]
	_, device := be.(kernels.DeviceMemory) // a device holds its own copy
	m, err := model.Load(dir, be, model.LoadOptions{Lo: s.Lo, Hi: s.Hi, Embed: l.HoldsEmbed(r), Head: l.HoldsHead(r), LatentNormEps: latentEps, Pin: !device, Shard: l.Shard(r)})
	if err != nil {
		return nil, fmt.Errorf("rank %d layers [%d, %d): %w", r, s.Lo, s.Hi, err)
	}
	return m, nil
}
