package synth_test

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/tandem-inference/tandem/kernels/cpu"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/vision"
)

// TestSyntheticVisionTower: the tiny preset's small tower is written under
// the released names, in the released shards (projector second to last,
// tower last) or in the last shard of a chosen count; it loads and gives
// finite features of the text width, and the text loader ignores it.
func TestSyntheticVisionTower(t *testing.T) {
	for _, shards := range []int{0, 2} {
		dir := writeTiny(t, shards, 1)
		ck, err := safetensors.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		files := ck.Files()
		proj, _ := ck.Tensor("mm_projector.proj.0.weight")
		tower, _ := ck.Tensor("vision_tower.encoder.blocks.1.mlp.fc1.weight")
		ck.Close()
		wantProj, wantTower := files[len(files)-2], files[len(files)-1]
		if shards > 0 {
			wantProj = wantTower
		}
		if proj.File != wantProj || tower.File != wantTower {
			t.Fatalf("shards %d: projector in %s, tower in %s; want %s and %s", shards, filepath.Base(proj.File), filepath.Base(tower.File), filepath.Base(wantProj), filepath.Base(wantTower))
		}
		text, err := model.Load(dir, cpu.New(1), model.LoadOptions{Embed: true, Head: true})
		if err != nil {
			t.Fatalf("shards %d: the text loader: %v", shards, err)
		}
		text.Close()

		tw, err := vision.Load(context.Background(), cpu.New(2), dir)
		if err != nil {
			t.Fatal(err)
		}
		c := tw.Config()
		img := vision.Patches{GridH: 4, GridW: 6, Pixels: make([]float32, 4*6*c.PatchValues())}
		for i := range img.Pixels {
			img.Pixels[i] = float32(math.Sin(float64(i)))
		}
		feats, err := tw.Features(context.Background(), []vision.Patches{img})
		tw.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(feats) != 1 || len(feats[0]) != 6*c.TextHidden || c.TextHidden != 64 {
			t.Fatalf("features %d x %d, want 1 image of 6 rows of 64", len(feats), len(feats[0]))
		}
		var ss float64
		for _, v := range feats[0] {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("feature %v", v)
			}
			ss += float64(v) * float64(v)
		}
		// The post norm makes rows of rms about its weights' (1 ± 0.1).
		if rms := math.Sqrt(ss / float64(len(feats[0]))); rms < 0.8 || rms > 1.2 {
			t.Fatalf("feature rms %.3f, want about 1", rms)
		}
	}
}
