package media

import (
	"fmt"
	"math"
)

// The released processor's settings for K3 (preprocessor_config.json,
// media_proc_cfg): 14-pixel patches merged 2x2, at most 65,536 patches in all
// and 512 on a side.
const (
	PatchSize     = 14
	MergeSize     = 2
	maxPatches    = 65536
	maxSidePatch  = 512
	maxSidePixels = maxSidePatch * PatchSize // 7168
	padMultiple   = MergeSize * PatchSize    // 28

	// maxDim bounds the sizes Plan accepts so its arithmetic cannot overflow;
	// Limits refuse far smaller images first.
	maxDim = 1 << 24
)

// Plan is the scale rule alone: the resized size and the padded patch grid
// for an original size (after EXIF orientation), so callers can count feature
// rows from Probe without decoding pixels.
//
// s = min(1, sqrt(65536 / (max(1, W div 14) * max(1, H div 14))), 7168/W, 7168/H);
// the resized size is (max(1, floor(W s)), max(1, floor(H s))), each at most
// 7168; the grid is the resized size padded up to multiples of 28, in patches.
func Plan(w, h int) (resizedW, resizedH, gridW, gridH int, err error) {
	if w <= 0 || h <= 0 || w > maxDim || h > maxDim {
		return 0, 0, 0, 0, fmt.Errorf("media: image size %dx%d is out of range (each side 1 to %d pixels)", w, h, maxDim)
	}
	pw, ph := max(1, w/PatchSize), max(1, h/PatchSize)
	s := min(1,
		math.Sqrt(float64(maxPatches)/(float64(pw)*float64(ph))),
		float64(maxSidePixels)/float64(w),
		float64(maxSidePixels)/float64(h))
	resizedW = min(max(1, int(float64(w)*s)), maxSidePixels)
	resizedH = min(max(1, int(float64(h)*s)), maxSidePixels)
	gridW = roundUp(resizedW, padMultiple) / PatchSize
	gridH = roundUp(resizedH, padMultiple) / PatchSize
	return resizedW, resizedH, gridW, gridH, nil
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }
