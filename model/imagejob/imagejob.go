// Package imagejob prepares a job's images where its prompt is prefilled:
// each encoded file is decoded and preprocessed (package media), matched
// with its run of <|media_pad|> ids in the prompt (the i-th run is the i-th
// image's, one id per feature row), and, when the worker prefills the run,
// run through the vision tower once for the whole job. The result is what
// the model takes (model.Media, feature rows at their positions) and what
// the prefix caches key on (each image's pixel hash at its run).
package imagejob

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tandem-inference/tandem/costmodel"
	"github.com/tandem-inference/tandem/internal/prefixkey"
	"github.com/tandem-inference/tandem/kernels"
	"github.com/tandem-inference/tandem/media"
	"github.com/tandem-inference/tandem/model"
	"github.com/tandem-inference/tandem/model/safetensors"
	"github.com/tandem-inference/tandem/model/vision"
)

// ErrNoTower is wrapped by the refusal of an image job on a worker that
// has no vision tower.
var ErrNoTower = errors.New("no vision tower")

// Tower computes feature rows: *vision.Tower's Features.
type Tower interface {
	Features(ctx context.Context, imgs []vision.Patches) ([][]float32, error)
}

// Encoder prepares the image jobs of one worker.
type Encoder struct {
	// Tower runs the images (nil: the worker has none, and refuses jobs
	// whose images it would have to run).
	Tower Tower
	// Limits bound each image before it is decoded.
	Limits media.Limits
	// Pad is <|media_pad|>'s id; Hidden the text tower's width.
	Pad    int32
	Hidden int
	// Where names the worker in errors ("prefill worker p1").
	Where string
	// Vision counts the tower's work for the measured rate (nil: none).
	Vision *costmodel.Vision

	mu         sync.Mutex
	work, took float64 // FLOPs and seconds of the tower runs so far
}

// NewEncoder is an encoder for model c with tower t (nil: none).
func NewEncoder(c *model.Config, t Tower, where string) *Encoder {
	e := &Encoder{Tower: t, Limits: media.DefaultLimits(), Pad: c.MediaPadID(), Hidden: c.HiddenSize, Where: where}
	if v, ok := costmodel.VisionOf(&c.Config); ok {
		e.Vision = &v
	}
	return e
}

// Rate is the tower's measured rate, GFLOP/s over the cost model's count
// of its work, over every run so far (0 before the first): what the
// worker's heartbeat tells the router.
func (e *Encoder) Rate() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.took <= 0 {
		return 0
	}
	return e.work / e.took / 1e9
}

// Job is a job's images, decoded and placed on their pad runs.
type Job struct {
	Runs   []kernels.Span // in the prompt given to Prepare
	Images []*media.Image
	// Decode is how long decoding and preprocessing took.
	Decode time.Duration
}

// Prepare decodes the job's images and places them on prompt's pad runs:
// the i-th run is images[i]'s and must hold one pad per feature row. A job
// without images gives nil.
func (e *Encoder) Prepare(prompt []int32, images [][]byte) (*Job, error) {
	if len(images) == 0 {
		return nil, nil
	}
	runs := model.PadRuns(prompt, e.Pad)
	if len(runs) != len(images) {
		return nil, fmt.Errorf("the job has %d images, its prompt holds %d runs of <|media_pad|> (id %d): one run per image, one pad per feature row", len(images), len(runs), e.Pad)
	}
	t0 := time.Now()
	j := &Job{Runs: runs, Images: make([]*media.Image, len(images))}
	for i, data := range images {
		im, err := media.Decode(data, e.Limits)
		if err != nil {
			return nil, fmt.Errorf("image %d: %w", i+1, err)
		}
		if im.Rows() != runs[i].Len() {
			return nil, fmt.Errorf("image %d (%dx%d) has %s feature rows, the prompt holds %s pad tokens for it (positions %d to %d)",
				i+1, im.Width, im.Height, thousands(im.Rows()), thousands(runs[i].Len()), runs[i].Lo, runs[i].Hi-1)
		}
		j.Images[i] = im
	}
	j.Decode = time.Since(t0)
	return j, nil
}

// Keys are the images as the prefix caches key them, at their runs
// shifted by base (the position of the prompt's first token).
func (j *Job) Keys(base int) []prefixkey.Image {
	if j == nil {
		return nil
	}
	out := make([]prefixkey.Image, len(j.Images))
	for i, im := range j.Images {
		out[i] = prefixkey.Image{At: base + j.Runs[i].Lo, Len: j.Runs[i].Len(), Hash: im.Hash}
	}
	return out
}

// Needs reports whether any image's run reaches past position from: the
// worker prefills part of it and needs its rows.
func (j *Job) Needs(from int) bool {
	return j != nil && len(j.Runs) > 0 && j.Runs[len(j.Runs)-1].Hi > from
}

// CheckTower refuses, with an error that reaches the client, an image job
// whose rows this worker would have to compute without a tower.
func (e *Encoder) CheckTower(j *Job) error {
	if j != nil && e.Tower == nil {
		return fmt.Errorf("%s: %w: the checkpoint it serves has none, so it cannot take image inputs (serve a checkpoint with vision_tower.* and mm_projector.* tensors, or send text only)", e.Where, ErrNoTower)
	}
	return nil
}

// Features runs the tower over every image of the job at once and
// returns each image's rows, in order.
func (e *Encoder) Features(ctx context.Context, j *Job) ([][]float32, error) {
	if err := e.CheckTower(j); err != nil {
		return nil, err
	}
	ps := make([]vision.Patches, len(j.Images))
	for i, im := range j.Images {
		ps[i] = vision.Patches{GridH: im.GridH, GridW: im.GridW, Pixels: im.Pixels}
	}
	t0 := time.Now()
	feats, err := e.Tower.Features(ctx, ps)
	if err != nil {
		return nil, fmt.Errorf("vision tower: %w", err)
	}
	if e.Vision != nil {
		patches := make([]int, len(ps))
		for i, p := range ps {
			patches[i] = p.GridH * p.GridW
		}
		e.mu.Lock()
		e.work += e.Vision.Work(patches)
		e.took += time.Since(t0).Seconds()
		e.mu.Unlock()
	}
	if len(feats) != len(j.Images) {
		return nil, fmt.Errorf("vision tower: %d feature sets for %d images", len(feats), len(j.Images))
	}
	for i, f := range feats {
		if len(f) != j.Runs[i].Len()*e.Hidden {
			return nil, fmt.Errorf("vision tower: image %d: %d values for %d rows of %d", i+1, len(f), j.Runs[i].Len(), e.Hidden)
		}
	}
	return feats, nil
}

// Media places feature rows on the job's runs, shifted by base.
func (j *Job) Media(feats [][]float32, base int) []model.Media {
	out := make([]model.Media, len(feats))
	for i, f := range feats {
		out[i] = model.Media{At: base + j.Runs[i].Lo, Rows: f}
	}
	return out
}

// WeightBytes is the size of the checkpoint's vision tower and projector
// as stored (vision_tower.* and mm_projector.*): what a worker that keeps
// the tower resident adds to its memory. 0 when it has none.
func WeightBytes(dir string) (int64, error) {
	ck, err := safetensors.Open(dir)
	if err != nil {
		return 0, err
	}
	defer ck.Close()
	var n int64
	for _, name := range ck.Names() {
		if strings.HasPrefix(name, "vision_tower.") || strings.HasPrefix(name, "mm_projector.") {
			t, _ := ck.Tensor(name)
			n += t.Size
		}
	}
	return n, nil
}

// thousands writes n with commas (1,056), as the messages users read do.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
