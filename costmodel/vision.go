package costmodel

import (
	"encoding/json"
	"time"

	"github.com/tandem-inference/tandem/internal/modelconfig"
)

// Vision is what the cost model counts of a vision tower: the sizes that
// set its work. The tower runs once per image job where the prompt is
// prefilled, before the prompt's first pass or chunk, so a job with images
// waits for it on either path.
type Vision struct {
	Layers, Hidden, QKV, MLP int
	PatchValues              int // pixel values of one patch (3 x 14 x 14)
	Merge                    int // patches merged into one row (2 x 2)
	TextHidden               int
}

// visionSizes are the vision_config fields that set the work (released
// names); K3's values stand for those left out.
type visionSizes struct {
	Hidden *int  `json:"vt_hidden_size"`
	MLP    *int  `json:"vt_intermediate_size"`
	Layers *int  `json:"vt_num_hidden_layers"`
	QKV    *int  `json:"qkv_hidden_size"`
	Patch  *int  `json:"patch_size"`
	Merge  []int `json:"merge_kernel_size"`
}

// VisionOf is c's vision tower as the cost model counts it; false when the
// config has none. (model/vision validates the config; this only sizes
// the work, so a malformed one is taken as none.)
func VisionOf(c *modelconfig.Config) (Vision, bool) {
	if len(c.Vision) == 0 || string(c.Vision) == "null" {
		return Vision{}, false
	}
	var s visionSizes
	if err := json.Unmarshal(c.Vision, &s); err != nil {
		return Vision{}, false
	}
	v := Vision{Layers: 27, Hidden: 1024, QKV: 1536, MLP: 4096, PatchValues: 3 * 14 * 14, Merge: 4, TextHidden: c.HiddenSize}
	for _, f := range []struct {
		dst *int
		src *int
	}{{&v.Hidden, s.Hidden}, {&v.MLP, s.MLP}, {&v.Layers, s.Layers}, {&v.QKV, s.QKV}} {
		if f.src != nil && *f.src > 0 {
			*f.dst = *f.src
		}
	}
	if s.Patch != nil && *s.Patch > 0 {
		v.PatchValues = 3 * *s.Patch * *s.Patch
	}
	if len(s.Merge) == 2 && s.Merge[0] > 0 && s.Merge[1] > 0 {
		v.Merge = s.Merge[0] * s.Merge[1]
	}
	return v, true
}

// Work is the FLOPs of the tower and projector over images of the given
// patch counts: per patch, the patch embedding and each block's
// projections (qkv, output, the MLP); per pair of patches of one image,
// each block's attention scores and weighted sum (full attention inside
// an image); per merged row, the projector's two matrices.
func (v Vision) Work(patches []int) float64 {
	var f float64
	perPatch := float64(2*v.PatchValues*v.Hidden) +
		float64(v.Layers)*2*float64(v.Hidden*3*v.QKV+v.QKV*v.Hidden+2*v.Hidden*v.MLP)
	merged := v.Hidden * v.Merge
	for _, n := range patches {
		p := float64(n)
		f += perPatch*p + float64(v.Layers)*4*p*p*float64(v.QKV)
		rows := p / float64(v.Merge)
		f += rows * 2 * float64(merged*merged+merged*v.TextHidden)
	}
	return f
}

// Image is one image of a job as the router prices it: where its pad run
// ends in the prompt (a path whose cached prefix covers it runs no tower
// for it) and its patches.
type Image struct {
	End, Patches int
}

// visionTime is the tower's time on a path for the images past the first
// from positions, at gflops (the path's measured vision rate; 0: its dense
// FFN rate, the nearest measured term, as a stand-in). No image to run
// costs nothing; an unknown rate costs Unknown.
func visionTime(m *Model, gflops float64, c Compute, imgs []Image, from int) time.Duration {
	var patches []int
	for _, im := range imgs {
		if im.End > from {
			patches = append(patches, im.Patches)
		}
	}
	if len(patches) == 0 || m.Vision == nil {
		return 0
	}
	if gflops <= 0 {
		gflops = c.Dense
	}
	if !(gflops > 0) {
		return Unknown
	}
	return seconds(m.Vision.Work(patches) / gflops / 1e9)
}

// ImagesOf places images of the given patch counts on prompt's runs of
// pad, the i-th run the i-th image's (runs without an image are not
// priced).
func ImagesOf(prompt []int32, pad int32, patches []int) []Image {
	var out []Image
	for i := 0; i < len(prompt) && len(out) < len(patches); i++ {
		if prompt[i] != pad {
			continue
		}
		j := i
		for j < len(prompt) && prompt[j] == pad {
			j++
		}
		out = append(out, Image{End: j, Patches: patches[len(out)]})
		i = j
	}
	return out
}
