package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"go.uber.org/zap"

	"github.com/tandem-inference/tandem/decode-worker/rank"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/kernels/metal"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/imagejob"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/vision"
)

// openBackend makes the compute backend --backend names: cpu, metal (the
// Mac's GPU; an error saying why where there is none), or auto (Metal on
// Apple Silicon when it opens, else the CPU, with the reason logged). It
// returns the resolved kind ("cpu" or "metal") and a func that releases
// the backend. The Metal backend has been checked only through its host
// emulator (kernels/metal/emu), never on a Mac.
func openBackend(kind string, threads int, log *zap.Logger) (kernels.Backend, string, func(), error) {
	if kind == "cpu" || (kind == "auto" && !(runtime.GOOS == "darwin" && runtime.GOARCH == "arm64")) {
		return cpu.New(threads), "cpu", func() {}, nil
	}
	b, err := metal.Open()
	if err != nil {
		if kind == "metal" {
			return nil, "", nil, fmt.Errorf("--backend metal: %w", err)
		}
		log.Info("backend auto: Metal is not usable, computing on the CPU", zap.Error(err))
		return cpu.New(threads), "cpu", func() {}, nil
	}
	free, total := b.DeviceMemory()
	log.Info("backend: Metal", zap.String("requested", kind), zap.String("device", b.Name()),
		zap.Int64("working_set_bytes", total), zap.Int64("free_bytes", free))
	return b, "metal", func() { b.Close() }, nil
}

// residentBytes is the checkpoint's bytes rank r of l keeps resident: its
// stage's layers' tensors (its tensor rank's share, rank.TensorBytes), the
// embedding on the first stage, the vision tower on rank 0 and the other
// model-level tensors (final mix, norm, lm_head) on the last stage.
func residentBytes(ck *safetensors.Checkpoint, c *model.Config, l *rank.Layout, r int) int64 {
	s, sh := l.Ranks[r], l.Shard(r)
	var n int64
	for _, name := range ck.Names() {
		L, ok := model.LayerOf(name)
		if !ok {
			if r == 0 && isVision(name) {
				t, _ := ck.Tensor(name)
				n += t.Size
			}
			continue
		}
		t, _ := ck.Tensor(name)
		switch {
		case L == model.GlobalsGroup && isEmbedding(name):
			if l.HoldsEmbed(r) {
				n += t.Size
			}
		case L == model.GlobalsGroup:
			if l.HoldsHead(r) {
				n += rank.TensorBytes(c, name, t.Size, sh)
			}
		case L >= s.Lo && L < s.Hi:
			n += rank.TensorBytes(c, name, t.Size, sh)
		}
	}
	return n
}

func isEmbedding(name string) bool { return name == "language_model.model.embed_tokens.weight" }

// isVision tells the vision tower's and projector's tensors, which rank 0
// keeps when the checkpoint has them (it prefills local prompts' images).
func isVision(name string) bool {
	return strings.HasPrefix(name, "vision_tower.") || strings.HasPrefix(name, "mm_projector.")
}

// rankImages is rank 0's image encoder, with the checkpoint's vision tower
// loaded on the rank's backend when it has one (without, the encoder
// refuses jobs whose images the group would prefill); nil on other ranks.
// The func releases the tower.
func rankImages(ctx context.Context, cfg *workerConfig, l *rank.Layout, c *model.Config, be kernels.Backend, log *zap.Logger) (*imagejob.Encoder, func(), error) {
	if cfg.Rank != 0 {
		return nil, func() {}, nil
	}
	where := fmt.Sprintf("decode group %s", l.Group)
	t, err := vision.Load(ctx, be, cfg.Model)
	if errors.Is(err, vision.ErrNoVisionTower) {
		log.Info("no vision tower in the checkpoint: jobs with images that this group prefills are refused", zap.Error(err))
		return imagejob.NewEncoder(c, nil, where), func() {}, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("vision tower: %w", err)
	}
	log.Info("vision tower loaded", zap.Int("layers", t.Config().Layers), zap.Int("width", t.Config().Hidden))
	return imagejob.NewEncoder(c, t, where), func() { t.Close() }, nil
}

// checkFits refuses a rank whose resident weights exceed the GPU's working
// set: the device would page, or fail mid-step, instead of failing here.
func checkFits(need, total int64, r, lo, hi int) error {
	if total > 0 && need > total {
		return fmt.Errorf("rank %d's layers [%d, %d) hold %s of weights, more than the GPU's working set of %s: give this rank fewer layers in the group config, or run it with --backend cpu",
			r, lo, hi, rank.Bytes(need), rank.Bytes(total))
	}
	return nil
}
