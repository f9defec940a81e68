package vision

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tandem-inference/tandem/kernels/cpu"
)

// TestHostileCheckpoint: a checkpoint that lacks a tensor, has one of the
// wrong shape, a NaN in a norm, or no vision tower at all is refused with
// an error naming the tensor (or saying there is no tower).
func TestHostileCheckpoint(t *testing.T) {
	c := testConfig()
	block1 := BlockPrefix(1) + "mlp.fc0.weight"
	for _, tc := range []struct {
		name    string
		vision  map[string]any
		edit    func(map[string]tensor)
		want    string
		noTower bool
	}{
		{name: "missing block tensor", edit: func(m map[string]tensor) { delete(m, block1) }, want: block1 + " is missing"},
		{name: "missing post norm", edit: func(m map[string]tensor) { delete(m, namePostNorm) }, want: namePostNorm + " is missing"},
		{name: "wrong shape", edit: func(m map[string]tensor) {
			x := m[BlockPrefix(0)+"wqkv.weight"]
			x.shape = []int64{x.shape[1], x.shape[0]}
			m[BlockPrefix(0)+"wqkv.weight"] = x
		}, want: BlockPrefix(0) + "wqkv.weight has shape [32 144]"},
		{name: "table of another grid", edit: func(m map[string]tensor) {
			x := m[namePosEmb]
			x.shape = []int64{4, 6, 32}
			m[namePosEmb] = x
		}, want: namePosEmb + " has shape [4 6 32]"},
		{name: "NaN norm", edit: func(m map[string]tensor) {
			x := m[nameFinalNorm]
			x.vals = append([]float32(nil), x.vals...)
			x.vals[3] = float32(nan())
			m[nameFinalNorm] = x
		}, want: nameFinalNorm + ": element 3 of 32 is NaN"},
		{name: "no vision tensors", edit: func(m map[string]tensor) { clear(m) }, noTower: true},
		{name: "no vision_config", vision: map[string]any{}, noTower: true},
		{name: "another projector", vision: map[string]any{"mm_projector_type": "patchmerger"}, want: `mm_projector_type is "patchmerger"`},
		{name: "biases", vision: map[string]any{"attn_bias": true}, want: "attn_bias is true"},
		{name: "odd head width", vision: map[string]any{"qkv_hidden_size": 36}, want: "multiple of 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := randomTensors(c, 1)
			if tc.edit != nil {
				tc.edit(ts)
			}
			vj := visionJSON(c)
			for k, v := range tc.vision {
				vj[k] = v
			}
			if tc.vision != nil && len(tc.vision) == 0 {
				vj = nil
			}
			dir := t.TempDir()
			writeCheckpoint(t, dir, vj, ts)
			tw, err := Load(context.Background(), cpu.New(1), dir)
			if err == nil {
				tw.Close()
				t.Fatal("loaded")
			}
			if tc.noTower != errors.Is(err, ErrNoVisionTower) {
				t.Fatalf("error %q: ErrNoVisionTower is %v, want %v", err, !tc.noTower, tc.noTower)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("error %q does not say %q and the folder", err, tc.want)
			}
		})
	}
}

// TestBadPatches: images the tower cannot take are refused before any work.
func TestBadPatches(t *testing.T) {
	c := testConfig()
	tw, _ := loadTest(t, c, 1)
	ok := randomPatches(c, 2, 2, 1)
	for _, tc := range []struct {
		p    Patches
		want string
	}{
		{Patches{GridH: 3, GridW: 2, Pixels: make([]float32, 6*588)}, "image 1: patch grid 3x2 is not a positive multiple"},
		{Patches{GridH: 0, GridW: 2}, "image 1: patch grid 0x2"},
		{Patches{GridH: 2, GridW: 2, Pixels: make([]float32, 5)}, "image 1: 5 pixel values"},
		{Patches{GridH: 514, GridW: 2}, "side over 512 patches"},
	} {
		_, err := tw.Features(context.Background(), []Patches{ok, tc.p})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("grid %dx%d: error %v, want %q", tc.p.GridH, tc.p.GridW, err, tc.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tw.Features(ctx, []Patches{ok}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}
